//! Conversation continuity: runs that name the same conversation key share
//! one conversation thread. A run loads its recent history (by count and by tokens, whole
//! units) as the start of its own shared history, and when it completes, its input and final
//! answer are appended to the conversation as two turns. Different keys are different
//! threads, so they never see each other's turns. A conversation belongs to the tenant whose
//! view of the store the run uses (see [`contexture_store::Scoped`]), like every thread.

use contexture_core::budget::SUMMARY_TAG;
use contexture_core::compact::{NOTES_TAG, ORIGINAL_REQUEST_TAG};
use contexture_core::fit::units;
use contexture_core::thread::{EventKind, Thread};
use contexture_core::tokens::TokenCounter;
use contexture_core::{Message, Role};
use contexture_store::NewEvent;

use crate::workflow::{ConversationPolicy, Workflow};

/// The tag of history messages a run loaded from its conversation.
pub const CONVERSATION_TAG: &str = "conversation";

/// Who and what a conversation belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConversationKey {
    /// The user.
    pub user: String,
    /// The workflow (its name, or its file's stem).
    pub workflow: String,
    /// An optional chat id, for several conversations of one user with one workflow.
    pub chat: Option<String>,
}

impl ConversationKey {
    /// The key of `user`'s conversation (`chat`, when the user has several) with `workflow`,
    /// read from `file`: the workflow is known by its `name`, else by its file's stem, so a
    /// run from the command line and one through the server continue the same conversation.
    pub fn new(
        user: &str,
        chat: Option<String>,
        workflow: &Workflow,
        file: &str,
    ) -> ConversationKey {
        ConversationKey {
            user: user.to_owned(),
            workflow: workflow.name.clone().unwrap_or_else(|| {
                std::path::Path::new(file)
                    .file_stem()
                    .map(|stem| stem.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            chat,
        }
    }

    /// The conversation's thread id: `conversation:USER:WORKFLOW[:CHAT]`, each part with `%`
    /// and `:` escaped, so two keys never share a thread.
    pub fn thread_id(&self) -> String {
        let escape = |part: &str| part.replace('%', "%25").replace(':', "%3A");
        let mut id = format!(
            "conversation:{}:{}",
            escape(&self.user),
            escape(&self.workflow)
        );
        if let Some(chat) = &self.chat {
            id.push(':');
            id.push_str(&escape(chat));
        }
        id
    }
}

/// The history a run loads from its conversation: the messages an earlier compaction keeps
/// at the start (the original request, notes, the summary) when they fit, then the most recent
/// whole units within `policy.history_messages` messages and `policy.history_tokens` tokens.
/// Each loaded message is tagged [`CONVERSATION_TAG`].
pub fn history(
    thread: &Thread,
    policy: &ConversationPolicy,
    counter: &TokenCounter,
) -> Vec<Message> {
    let messages = thread.projection().messages;
    let tokens = |m: &Message| u64::from(counter.count_message(m));
    let head: Vec<usize> = messages
        .iter()
        .enumerate()
        .take_while(|(_, m)| {
            m.metadata
                .tags
                .iter()
                .any(|t| t == ORIGINAL_REQUEST_TAG || t == NOTES_TAG || t == SUMMARY_TAG)
        })
        .map(|(i, _)| i)
        .collect();
    let mut budget_tokens = policy.history_tokens;
    let mut budget_messages = policy.history_messages;
    let mut chosen: Vec<usize> = Vec::new();
    for &i in &head {
        let cost = tokens(&messages[i]);
        if budget_messages == 0 || cost > budget_tokens {
            break;
        }
        budget_tokens -= cost;
        budget_messages -= 1;
        chosen.push(i);
    }
    let mut tail: Vec<usize> = Vec::new();
    for unit in units(&messages).iter().rev() {
        if unit.start < head.len() {
            break;
        }
        let cost: u64 = messages[unit.messages()].iter().map(tokens).sum();
        if unit.len() > budget_messages || cost > budget_tokens {
            break;
        }
        budget_messages -= unit.len();
        budget_tokens -= cost;
        tail.splice(0..0, unit.messages());
    }
    // A conversation's turns start with the user: a tail that would start with an answer
    // drops it.
    while tail
        .first()
        .is_some_and(|&i| messages[i].role != Role::User)
    {
        tail.remove(0);
    }
    chosen.extend(tail);
    chosen
        .into_iter()
        .map(|i| {
            let mut message = messages[i].clone();
            if !message.metadata.tags.iter().any(|t| t == CONVERSATION_TAG) {
                message.metadata.tags.push(CONVERSATION_TAG.to_owned());
            }
            message
        })
        .collect()
}

/// The turns a completed run adds to its conversation: its input (when it has one) and its
/// final answer, keyed by the execution so that a retried completion adds them once.
pub fn turns(execution_id: &str, input: &str, output: &str) -> Vec<NewEvent> {
    let mut turns = Vec::new();
    if !input.is_empty() {
        turns.push(
            NewEvent::new(EventKind::MessageAppended {
                message: Message::user(input),
            })
            .with_key(format!("{execution_id}:input")),
        );
    }
    turns.push(
        NewEvent::new(EventKind::MessageAppended {
            message: Message::assistant(output),
        })
        .with_key(format!("{execution_id}:output")),
    );
    turns
}

#[cfg(test)]
mod tests {
    use super::*;
    use contexture_core::thread::Event;
    use contexture_core::tokens::Encoding;

    #[test]
    fn keys_map_to_distinct_threads() {
        let key = |user: &str, workflow: &str, chat: Option<&str>| ConversationKey {
            user: user.into(),
            workflow: workflow.into(),
            chat: chat.map(str::to_owned),
        };
        assert_eq!(
            key("ann", "support", None).thread_id(),
            "conversation:ann:support"
        );
        assert_eq!(
            key("ann", "support", Some("7")).thread_id(),
            "conversation:ann:support:7"
        );
        // A colon inside a part cannot make two keys collide.
        assert_ne!(
            key("a:b", "c", None).thread_id(),
            key("a", "b:c", None).thread_id()
        );
    }

    #[test]
    fn history_honours_the_count_and_the_token_limit() {
        let mut thread = Thread::new("c");
        for n in 0..10 {
            for message in [
                Message::user(format!("question {n}")),
                Message::assistant(format!("answer {n} {}", "word ".repeat(n * 10))),
            ] {
                thread
                    .apply(Event::new(
                        thread.last_seq() + 1,
                        EventKind::MessageAppended { message },
                    ))
                    .unwrap();
            }
        }
        let counter = TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        };
        let texts = |policy: ConversationPolicy| -> Vec<String> {
            history(&thread, &policy, &counter)
                .iter()
                .map(|m| m.text().split(' ').take(2).collect::<Vec<_>>().join(" "))
                .collect()
        };
        let by_count = ConversationPolicy {
            history_messages: 4,
            history_tokens: 100_000,
            compaction: None,
        };
        assert_eq!(
            texts(by_count),
            ["question 8", "answer 8", "question 9", "answer 9"]
        );
        // Answer 9 alone is about 100 tokens: a 150-token budget keeps the last turn only.
        let by_tokens = ConversationPolicy {
            history_messages: 20,
            history_tokens: 150,
            compaction: None,
        };
        assert_eq!(texts(by_tokens), ["question 9", "answer 9"]);
    }
}
