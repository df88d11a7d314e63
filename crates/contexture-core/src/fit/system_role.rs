//! Where a request's system prompt goes, for providers that ignore the system role.
//!
//! Some OpenAI-compatible providers drop (or refuse) a `system` message. A model may declare
//! its [`SystemRole`]: `native` sends the prompt as the system message (the default), `user`
//! as the first user message instead, `both` in both places. The prompt is placed when a
//! request is built, never stored: a thread holds its system prompt once, so it is never
//! duplicated across turns or after a restore.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::message::{Message, Role};

/// The tag of a user message that carries the system prompt (never sent to a provider: tags
/// are Contexture's own).
pub const SYSTEM_PROMPT_TAG: &str = "system_prompt";

/// Where a model reads its system prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemRole {
    /// As the system message.
    #[default]
    Native,
    /// As the first user message (the provider ignores the system role).
    User,
    /// As the system message and again as the first user message.
    Both,
}

impl SystemRole {
    /// Every placement, in the order documentation lists them.
    pub const ALL: [SystemRole; 3] = [SystemRole::Native, SystemRole::User, SystemRole::Both];

    /// The name configuration writes.
    pub fn as_str(self) -> &'static str {
        match self {
            SystemRole::Native => "native",
            SystemRole::User => "user",
            SystemRole::Both => "both",
        }
    }

    /// True when the system prompt is also sent as a user message: it is then counted
    /// twice against the window under `both`.
    pub fn sends_as_user(self) -> bool {
        matches!(self, SystemRole::User | SystemRole::Both)
    }
}

impl std::fmt::Display for SystemRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `system_role` that is not one of `native`, `user`, `both`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown system_role `{name}` (known: native, user, both)")]
pub struct UnknownSystemRole {
    /// The name given.
    pub name: String,
}

impl FromStr for SystemRole {
    type Err = UnknownSystemRole;

    fn from_str(name: &str) -> Result<SystemRole, UnknownSystemRole> {
        SystemRole::ALL
            .into_iter()
            .find(|role| role.as_str() == name)
            .ok_or_else(|| UnknownSystemRole {
                name: name.to_owned(),
            })
    }
}

/// `messages` (a request, its system prompt first when it has one) with the system prompt
/// placed as `role` says: under `user` the leading system (or developer) message becomes a
/// user message, under `both` a user copy follows it. The copy is pinned and tagged
/// [`SYSTEM_PROMPT_TAG`]. Consecutive user turns this makes are left for the caller's
/// repair where the provider requires alternation.
pub fn place_system_prompt(mut messages: Vec<Message>, role: SystemRole) -> Vec<Message> {
    let Some(first) = messages.first() else {
        return messages;
    };
    if role == SystemRole::Native || !first.role.is_system_like() {
        return messages;
    }
    let mut as_user = first.clone();
    as_user.role = Role::User;
    as_user.metadata.pinned = true;
    as_user.metadata.tags.push(SYSTEM_PROMPT_TAG.to_owned());
    as_user.touch();
    match role {
        SystemRole::Both => messages.insert(1, as_user),
        _ => messages[0] = as_user,
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(messages: &[Message]) -> Vec<Role> {
        messages.iter().map(|message| message.role).collect()
    }

    #[test]
    fn each_placement_puts_the_prompt_where_it_says() {
        let request = vec![
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello"),
        ];
        let table = [
            (
                SystemRole::Native,
                vec![Role::System, Role::User, Role::Assistant],
            ),
            (
                SystemRole::User,
                vec![Role::User, Role::User, Role::Assistant],
            ),
            (
                SystemRole::Both,
                vec![Role::System, Role::User, Role::User, Role::Assistant],
            ),
        ];
        for (role, expected) in table {
            let placed = place_system_prompt(request.clone(), role);
            assert_eq!(roles(&placed), expected, "{role}");
            let prompt = placed
                .iter()
                .filter(|message| message.text() == "Be brief.")
                .count();
            assert_eq!(prompt, if role == SystemRole::Both { 2 } else { 1 });
        }
        // No system prompt: nothing to place.
        let plain = vec![Message::user("Hi")];
        assert_eq!(place_system_prompt(plain.clone(), SystemRole::User), plain);
    }

    #[test]
    fn names_round_trip_and_an_unknown_one_is_named() {
        for role in SystemRole::ALL {
            assert_eq!(role.as_str().parse::<SystemRole>(), Ok(role));
        }
        assert_eq!(
            "human".parse::<SystemRole>().unwrap_err().to_string(),
            "unknown system_role `human` (known: native, user, both)"
        );
    }
}
