//! Tenants. Every thread and execution a tenant creates is stored under an id that starts
//! with `TENANT/`; a tenant's requests can only name ids under its own prefix, so another
//! tenant's threads are not found (404) rather than forbidden, and ids cannot be probed.
//! Tenant names never contain `/`, so one tenant's prefix is never inside another's.

use serde_json::Value;

/// The tenant a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(String);

/// Checks a tenant name: 1 to 64 characters of ASCII letters, digits, `-`, `_` and `.`.
pub fn check_tenant(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "a tenant name has 1 to 64 characters, not {}",
            name.len()
        ));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(c) => Err(format!(
            "tenant `{name}`: {c:?} is not allowed (letters, digits, `-`, `_`, `.`)"
        )),
        None => Ok(()),
    }
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

impl Tenant {
    /// A tenant with a checked name.
    pub fn new(name: impl Into<String>) -> Result<Tenant, String> {
        let name = name.into();
        check_tenant(&name)?;
        Ok(Tenant(name))
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The stored id of the tenant's thread or execution `id`.
    pub fn scope(&self, id: &str) -> String {
        format!("{}/{id}", self.0)
    }

    /// A text for the client: ids quoted in it (`` `acme/x` ``) lose the tenant prefix.
    pub fn unscope_text(&self, text: &str) -> String {
        text.replace(&format!("`{}/", self.0), "`")
    }

    /// The client's id of a stored id, when it is this tenant's.
    pub fn unscope<'a>(&self, stored: &'a str) -> Option<&'a str> {
        stored
            .strip_prefix(self.0.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
    }
}

/// The JSON keys whose string values (or lists of strings) are stored ids.
const ID_KEYS: [&str; 9] = [
    "id",
    "parent",
    "child",
    "parent_execution_id",
    "child_execution_id",
    "execution_id",
    "request_id",
    "children",
    "thread",
];

impl Tenant {
    /// Rewrites the stored ids in a JSON document for the client: values of id fields lose
    /// the tenant prefix, and ids quoted in error texts (`` `acme/x` ``) too. Message texts
    /// are left alone, even when they happen to start with the prefix.
    pub fn unscope_json(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if ID_KEYS.contains(&key.as_str()) {
                        self.unscope_ids(value);
                    } else if matches!(key.as_str(), "error" | "reason") {
                        if let Value::String(text) = value {
                            *text = self.unscope_text(text);
                        } else {
                            self.unscope_json(value);
                        }
                    } else {
                        self.unscope_json(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.unscope_json(item)),
            _ => {}
        }
    }

    fn unscope_ids(&self, value: &mut Value) {
        match value {
            Value::String(id) => {
                if let Some(rest) = self.unscope(id) {
                    *id = rest.to_owned();
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.unscope_ids(item)),
            other => self.unscope_json(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_in_documents_lose_the_prefix_and_texts_do_not() {
        let acme = Tenant::new("acme").unwrap();
        let mut doc = serde_json::json!({
            "execution_id": "acme/run",
            "children": ["acme/run/a.1"],
            "error": "execution `acme/run`: cancelled",
            "kind": {"forked": {"parent": "acme/t", "at_seq": 2}},
            "message": {"content": "acme/widgets is down"}
        });
        acme.unscope_json(&mut doc);
        assert_eq!(doc["execution_id"], "run");
        assert_eq!(doc["children"][0], "run/a.1");
        assert_eq!(doc["error"], "execution `run`: cancelled");
        assert_eq!(doc["kind"]["forked"]["parent"], "t");
        assert_eq!(doc["message"]["content"], "acme/widgets is down");
    }

    #[test]
    fn a_tenant_sees_only_its_own_prefix() {
        let acme = Tenant::new("acme").unwrap();
        let acme2 = Tenant::new("acme2").unwrap();
        assert_eq!(acme.scope("t/1"), "acme/t/1");
        assert_eq!(acme.unscope("acme/t/1"), Some("t/1"));
        assert_eq!(acme.unscope(&acme2.scope("t")), None);
        assert_eq!(acme2.unscope(&acme.scope("t")), None);
        assert_eq!(acme.unscope("acme"), None);
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "a/b", "a b", "ü", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
        for good in ["acme", "team-1", "a.b_c"] {
            assert!(Tenant::new(good).is_ok(), "{good}");
        }
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
