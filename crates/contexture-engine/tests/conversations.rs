//! Conversation continuity: runs naming one conversation key share its
//! history, loaded by count and by tokens; different keys never see each other's turns;
//! a long conversation is compacted by its policy.

use crate::common;

use common::{executor, script, sqlite, texts};
use contexture_core::budget::SUMMARY_TAG;
use contexture_engine::conversation::{CONVERSATION_TAG, ConversationKey};
use contexture_engine::executor::{Executor, RunOutcome, RunRequest};
use contexture_store::{SqliteStore, Store};

const CHAT: &str = r#"
name: support
assistants: [{id: a, model: gpt-4o-mini, system_prompt: You help with orders.}]
states:
  - {id: answer, assistant_id: a, next: {end: true}}
"#;

fn key(user: &str) -> ConversationKey {
    ConversationKey {
        user: user.into(),
        workflow: "support".into(),
        chat: None,
    }
}

async fn say(exec: &Executor<SqliteStore>, workflow: &str, user: &str, input: &str) -> RunOutcome {
    exec.start(RunRequest {
        conversation: Some(key(user)),
        origin: Default::default(),
        user_context: None,
        ..RunRequest::new("support.yaml", workflow, input)
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_third_run_of_a_conversation_sees_the_first_two_turns_and_keys_are_isolated() {
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- content: Order 42 ships Friday.
- content: It weighs 3 kg.
- content: Yes, Friday, 3 kg, order 42.
- content: I know nothing about you yet.
"#,
    );
    let exec = executor(store.clone(), provider.clone());
    say(&exec, CHAT, "ann", "When does order 42 ship?").await;
    say(&exec, CHAT, "ann", "How heavy is it?").await;
    let third = say(&exec, CHAT, "ann", "Summarize, please.").await;
    assert_eq!(third.output, "Yes, Friday, 3 kg, order 42.");
    let sent = provider.requests();
    assert_eq!(
        texts(&sent[2].messages),
        [
            "You help with orders.",
            "When does order 42 ship?",
            "Order 42 ships Friday.",
            "How heavy is it?",
            "It weighs 3 kg.",
            "Summarize, please."
        ]
    );
    assert!(
        sent[2].messages[1..5]
            .iter()
            .all(|m| m.metadata.tags.contains(&CONVERSATION_TAG.to_owned()))
    );
    // Another user (another key) starts from nothing.
    say(&exec, CHAT, "bob", "What do you know about me?").await;
    assert_eq!(
        texts(&provider.requests()[3].messages),
        ["You help with orders.", "What do you know about me?"]
    );
    // The conversation threads hold every turn.
    let ann = store.load(&key("ann").thread_id()).await.unwrap();
    assert_eq!(ann.projection().messages.len(), 6);
    let bob = store.load(&key("bob").thread_id()).await.unwrap();
    assert_eq!(bob.projection().messages.len(), 2);
}

#[tokio::test]
async fn loading_honours_the_count_and_the_token_limit() {
    let (_dir, store) = sqlite().await;
    let replies: Vec<String> = (0..6)
        .map(|n| format!("- content: 'Answer {n}: {}'", "detail ".repeat(n * 20)))
        .collect();
    let provider = script(&replies.join("\n"));
    let exec = executor(store.clone(), provider.clone());
    let by_count = CHAT.replace(
        "name: support",
        "name: support\nconversation: {history_messages: 4, history_tokens: 100000}",
    );
    for n in 0..5 {
        say(&exec, &by_count, "ann", &format!("Question {n}")).await;
    }
    let fifth = texts(&provider.requests()[4].messages);
    assert_eq!(
        fifth.iter().map(|t| &t[..10]).collect::<Vec<_>>(),
        [
            "You help w",
            "Question 2",
            "Answer 2: ",
            "Question 3",
            "Answer 3: ",
            "Question 4"
        ],
        "four earlier messages"
    );
    // A token limit that only the last turn fits (answer 4 is about 80 tokens).
    let by_tokens = CHAT.replace(
        "name: support",
        "name: support\nconversation: {history_messages: 20, history_tokens: 100}",
    );
    say(&exec, &by_tokens, "ann", "Question 5").await;
    let sixth = texts(&provider.requests()[5].messages);
    assert_eq!(
        sixth.iter().map(|t| &t[..10]).collect::<Vec<_>>(),
        ["You help w", "Question 4", "Answer 4: ", "Question 5"]
    );
}

#[tokio::test]
async fn a_long_conversation_is_compacted_by_its_policy() {
    let (_dir, store) = sqlite().await;
    let provider = script(
        r#"
- content: one
- content: two
- content: three
- content: four
"#,
    );
    let exec = executor(store.clone(), provider.clone());
    let compacting = CHAT.replace(
        "name: support",
        "name: support\nconversation:\n  compaction: {trigger: {messages: 4}, keep: {messages: 2}}",
    );
    for n in 0..4 {
        say(
            &exec,
            &compacting,
            "ann",
            &format!("Question {n} about order ORD-{n}"),
        )
        .await;
    }
    // The fourth run found 6 messages (over 4): the conversation was compacted (offline)
    // and the run loaded the original request, the summary and the last turn.
    let fourth = &provider.requests()[3].messages;
    assert_eq!(fourth[1].text(), "Question 0 about order ORD-0");
    assert!(fourth[2].metadata.tags.contains(&SUMMARY_TAG.to_owned()));
    assert!(fourth[2].text().contains("ORD-1"));
    assert_eq!(
        texts(&fourth[3..]),
        [
            "Question 2 about order ORD-2",
            "three",
            "Question 3 about order ORD-3"
        ]
    );
    let thread = store.load(&key("ann").thread_id()).await.unwrap();
    assert!(thread.projection().messages.len() < 8, "compacted");
}
