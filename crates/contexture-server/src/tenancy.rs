//! Tenants. A request acts for one tenant, and reaches threads and executions through the
//! tenant's view of the store ([`contexture_store::Scoped`], see
//! [`crate::tenant_store::TenantStore`]): the ids a client names are the tenant's own, and
//! another tenant's threads are not found (404) rather than forbidden, so ids cannot be
//! probed.

pub use contexture_store::Tenant;

use contexture_engine::estimates::Learner;

/// Who an operation acts for: one tenant of the server (every request through HTTP), or
/// the operator at a terminal (`contexture mcp` over stdio), who sees the whole store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A tenant: its own view of the store, its own limits.
    Tenant(Tenant),
    /// The operator: the whole store, no per-tenant limits.
    Operator,
}

impl Actor {
    /// The key of the actor's share of the server's places (running executions, fitting
    /// threads): the tenant's name, or a name no tenant can have.
    pub fn key(&self) -> &str {
        match self {
            Actor::Tenant(tenant) => tenant.name(),
            // Tenant names have no spaces.
            Actor::Operator => "the operator",
        }
    }

    /// Whose calibration of token estimates the actor's requests read and feed.
    pub fn learner(&self) -> Learner {
        match self {
            Actor::Tenant(tenant) => Learner::Tenant(tenant.clone()),
            Actor::Operator => Learner::Operator,
        }
    }
}

/// Checks a tenant name as configuration gives it (see [`Tenant::new`]).
pub fn check_tenant(name: &str) -> Result<(), String> {
    Tenant::new(name)
        .map(drop)
        .map_err(|error| error.to_string())
}

/// Checks an id a client chose for a thread or an execution: 1 to 200 characters, none
/// that does not show (see [`contexture_core::names`]).
pub fn check_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() || id.chars().count() > 200 {
        return Err(format!("{what} has 1 to 200 characters"));
    }
    if let Some(hidden) = contexture_core::names::hidden_char(id) {
        let kind = if hidden.is_control() {
            "control"
        } else {
            "invisible"
        };
        return Err(format!(
            "{what} may not contain {kind} characters (U+{:04X})",
            u32::from(hidden)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_checked() {
        assert!(check_id("thread id", "a\nb").is_err());
        assert!(check_id("thread id", "chat/42 ü").is_ok());
        // Found by Unicode property: the tag block, line and paragraph separators,
        // variation selectors and U+180E among them.
        for invisible in [
            "a\u{200B}b",
            "\u{202E}txt.exe",
            "a\u{FEFF}",
            "x\u{2066}y",
            "t\u{E0074}\u{E0061}g",
            "a\u{2028}b",
            "a\u{2029}b",
            "a\u{FE0F}",
            "a\u{E0100}",
            "a\u{180E}b",
        ] {
            let error = check_id("thread id", invisible).unwrap_err();
            assert!(
                error.contains("invisible characters"),
                "{invisible:?}: {error}"
            );
        }
    }
}
