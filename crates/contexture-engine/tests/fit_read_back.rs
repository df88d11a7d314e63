//! Property: a history read from its end ([`FitSettings::fit_read_back`]) fits exactly as
//! the whole history does: the same messages, the same ranges left out (the unread ones
//! among them), the same tokens after; and it reads only as far back as it needs.

use crate::common;

use std::cell::Cell;
use std::convert::Infallible;

use contexture_core::fit::{ClearPolicy, FitPolicy, Strategy as Keep};
use contexture_core::thread::Projection;
use contexture_core::{Message, Role, ToolCall};
use contexture_engine::fitting::{FitOverrides, FitSettings};
use proptest::prelude::*;

/// A history of `turns`: a question, sometimes a tool call and its result, an answer; the
/// sizes drawn.
fn history(turns: &[(usize, Option<usize>, usize)]) -> Vec<Message> {
    let mut messages = Vec::new();
    for (turn, &(question, tool, answer)) in turns.iter().enumerate() {
        messages.push(Message::user(format!(
            "q{turn} {}",
            "ask ".repeat(question)
        )));
        if let Some(result) = tool {
            let id = format!("call_{turn}");
            messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                id.as_str(),
                "lookup",
                "{}",
            )]));
            messages.push(Message::tool_result(id.as_str(), "data ".repeat(result)));
        }
        messages.push(Message::assistant(format!(
            "a{turn} {}",
            "say ".repeat(answer)
        )));
    }
    messages
}

fn turns() -> impl Strategy<Value = Vec<(usize, Option<usize>, usize)>> {
    prop::collection::vec(
        (0usize..60, prop::option::of(0usize..120), 0usize..60),
        0..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn reading_back_fits_as_the_whole_history_does(
        turns in turns(),
        system in any::<bool>(),
        max_tokens in prop::option::of(100u32..1_200),
        clear in any::<bool>(),
        strategy in prop::sample::select(vec![Keep::Last, Keep::First]),
    ) {
        let model = common::small_models().get("small-window").unwrap();
        let policy = FitPolicy {
            strategy,
            clear_tool_results: clear.then(|| ClearPolicy {
                keep: 1,
                ..ClearPolicy::past_tokens(1)
            }),
            ..FitPolicy::default()
        };
        let overrides = FitOverrides { max_tokens, ..FitOverrides::default() };
        let settings = FitSettings::new(model, policy, overrides).unwrap();
        let messages = history(&turns);
        let system = system.then(|| Message::system("Be brief."));
        let whole = settings.fit(
            Projection {
                context: "main".to_owned(),
                system: system.clone(),
                messages: messages.clone(),
            },
            &[],
            &[],
        );
        let oldest_read = Cell::new(messages.len());
        let read_back = settings
            .fit_read_back(system, messages.len(), |index| {
                oldest_read.set(index);
                Ok::<_, Infallible>(messages[index].clone())
            }, &[])
            .unwrap();
        match (whole, read_back) {
            (Ok(whole), Ok(read_back)) => {
                prop_assert_eq!(&read_back.messages, &whole.messages);
                prop_assert_eq!(&read_back.fit.dropped, &whole.fit.dropped);
                prop_assert_eq!(read_back.fit.tokens_after, whole.fit.tokens_after);
                prop_assert_eq!(read_back.trim.partial, whole.trim.partial);
                if oldest_read.get() > 0 {
                    prop_assert_eq!(strategy, Keep::Last);
                    prop_assert!(!clear, "a policy that clears reads every message");
                    prop_assert!(read_back.fit.tokens_before.is_none());
                }
            }
            (Err(whole), Err(read_back)) => {
                prop_assert_eq!(whole.to_string(), read_back.to_string());
            }
            (whole, read_back) => {
                prop_assert!(false, "whole {:?} but read back {:?}", whole.is_ok(), read_back.is_ok());
            }
        }
    }
}

#[test]
fn a_long_history_is_read_only_as_far_as_the_window() {
    let model = common::small_models().get("small-window").unwrap();
    let settings = FitSettings::new(model, FitPolicy::default(), FitOverrides::default()).unwrap();
    let messages = history(&vec![(30, Some(50), 30); 2_000]);
    let read = Cell::new(0usize);
    let fitted = settings
        .fit_read_back(
            None,
            messages.len(),
            |index| {
                read.set(read.get() + 1);
                Ok::<_, Infallible>(messages[index].clone())
            },
            &[],
        )
        .unwrap()
        .unwrap();
    // The window is 1,500 tokens and a message is at least 30: no more than 60 are read of
    // the 8,000.
    assert!(read.get() <= 60, "read {} messages", read.get());
    assert!(!fitted.messages.is_empty());
    assert_eq!(fitted.fit.dropped[0][0], 0);
    assert_eq!(
        fitted
            .fit
            .dropped
            .iter()
            .map(|[from, to]| to - from)
            .sum::<usize>()
            + fitted.messages.len(),
        messages.len()
    );
}

/// A whole list read from its end takes a leading system or developer message as the system
/// prompt, as [`Projection::from_messages`] does, and reads each message at most once (the
/// first one too, when it is not a system prompt).
#[test]
fn a_list_read_back_takes_its_system_prompt_as_a_projection_does() {
    let model = common::small_models().get("small-window").unwrap();
    let policy = FitPolicy {
        strategy: Keep::First,
        ..FitPolicy::default()
    };
    let settings = FitSettings::new(model, policy, FitOverrides::default()).unwrap();
    let turns = history(&[(5, Some(10), 5), (5, None, 5)]);
    for lead in [
        Some(Message::system("Be brief.")),
        Some(Message::new(Role::Developer, "Answer in French.")),
        None,
    ] {
        let list: Vec<Message> = lead.into_iter().chain(turns.iter().cloned()).collect();
        let whole = settings
            .fit(Projection::from_messages(list.clone()), &[], &[])
            .unwrap();
        let reads = std::cell::RefCell::new(vec![0usize; list.len()]);
        let read_back = settings
            .fit_list_read_back(
                list.len(),
                |index| {
                    reads.borrow_mut()[index] += 1;
                    Ok::<_, Infallible>(list[index].clone())
                },
                &[],
            )
            .unwrap()
            .unwrap();
        assert_eq!(read_back.messages, whole.messages);
        assert_eq!(read_back.fit.dropped, whole.fit.dropped);
        // The strategy keeps the oldest messages, so every one is read: once.
        assert_eq!(reads.into_inner(), vec![1; list.len()]);
    }
}
