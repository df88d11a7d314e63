//! Table tests pinning each fitting option on one conversation: every row is an option
//! setting, its rendered output an insta snapshot (`snapshots/fit_table__*.snap`).

use contexture_core::fit::{
    ClearInputs, ClearOptions, ClearTrigger, Rules, Strategy, TrimError, TrimOptions, Trimmed,
    clear_tool_results, trim, validate,
};
use contexture_core::{Content, Encoding, Message, Part, Role, TokenCounter, ToolCall};

const COUNTER: TokenCounter = TokenCounter::exact(Encoding::O200kBase);

/// A research conversation: parallel tool calls, a pinned instruction, reasoning, a long
/// multi-line tool result and a multi-line user message.
fn conversation() -> Vec<Message> {
    let mut reasoning = Message::assistant("");
    reasoning.content = Some(Content::Parts(vec![
        Part::reasoning("Both areas are in the results; Lyon is larger."),
        Part::text("Lyon : 47,87 km² ; Porto : 41,42 km²."),
    ]));
    vec![
        Message::system("You are a research assistant. Cite your sources."),
        Message::user("Find the population of Lyon and of Porto."),
        Message::assistant_tool_calls(vec![
            ToolCall::new("c1", "search", r#"{"q":"Lyon population"}"#),
            ToolCall::new("c2", "search", r#"{"q":"Porto population"}"#),
        ]),
        Message::tool_result(
            "c1",
            "Lyon: 522,250 inhabitants (2021).\nMetropolis: 1.4 million.",
        ),
        Message::tool_result(
            "c2",
            "Porto: 231,800 inhabitants (2021).\nMetro area: 1.7 million.",
        ),
        Message::assistant("Lyon has about 522,000 inhabitants and Porto about 232,000."),
        Message::user("From now on, answer in French.").pinned(),
        Message::assistant("D'accord."),
        Message::user("Compare their areas.\nUse square kilometres.\nBe brief.\nThen stop."),
        reasoning,
        Message::user("Fetch the Lyon article."),
        Message::assistant_tool_calls(vec![ToolCall::new(
            "c3",
            "fetch",
            r#"{"url":"https://example.org/lyon"}"#,
        )]),
        Message::tool_result(
            "c3",
            "Lyon is the third-largest city of France.\nIt lies at the confluence of the Rhône and the Saône.\nIts historic centre is a UNESCO World Heritage Site.\nIt is known for its cuisine and gastronomy.",
        ),
        Message::assistant(
            "Lyon est la troisième ville de France, au confluent du Rhône et de la Saône.",
        ),
        Message::user("Merci ! Laquelle est la plus ancienne ?"),
    ]
}

fn render_messages(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        let mut line = format!("{:<9}", message.role.as_str());
        if message.is_pinned() {
            line.push_str(" [pinned]");
        }
        if let Some(id) = &message.tool_call_id {
            line.push_str(&format!(" ({id})"));
        }
        if let Some(Content::Parts(parts)) = &message.content
            && parts.iter().any(|p| matches!(p, Part::Reasoning { .. }))
        {
            line.push_str(" [reasoning]");
        }
        let text = message.text().replace('\n', " / ");
        if !text.is_empty() {
            line.push_str(&format!(" {text}"));
        }
        for call in &message.tool_calls {
            line.push_str(&format!(
                " -> {}({}) {}",
                call.name, call.id, call.arguments
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn render(result: &Result<Trimmed, TrimError>) -> String {
    match result {
        Err(error) => format!("error: {error}\n"),
        Ok(trimmed) => {
            let dropped: Vec<String> = trimmed
                .dropped
                .iter()
                .map(|r| format!("{}..{}", r.start, r.end))
                .collect();
            format!(
                "over_budget: {}\ndropped: [{}]\npartial: {:?}\nmarker: {:?}\ntokens: before {:?} (at least {}), after {}\nrepairs: {}\n---\n{}",
                trimmed.over_budget,
                dropped.join(", "),
                trimmed.partial,
                trimmed.marker,
                trimmed.tokens_before,
                trimmed.tokens_before_at_least,
                trimmed.tokens_after,
                trimmed.repairs.len(),
                render_messages(&trimmed.messages),
            )
        }
    }
}

fn options(max_tokens: u32) -> TrimOptions {
    TrimOptions::new(max_tokens)
}

/// One row per option. Unit costs of the conversation (o200k_base, chat recipe): system 14,
/// user 13, call unit 82, assistant 21, pinned user 12, assistant 7, user 18, reasoning
/// assistant 34, user 9, fetch unit 70, assistant 24, user 13; 320 with reply priming.
fn rows() -> Vec<(&'static str, TrimOptions)> {
    vec![
        // Rows named `unpinned_*` run on the conversation with its pin removed.
        ("unpinned_last", options(120)),
        (
            "unpinned_last_start_on_user",
            TrimOptions {
                start_on: vec![Role::User],
                ..options(120)
            },
        ),
        (
            "unpinned_last_anthropic",
            TrimOptions {
                rules: Rules::Anthropic,
                ..options(120)
            },
        ),
        ("last", options(120)),
        (
            "last_keep_system_false",
            TrimOptions {
                keep_system: false,
                ..options(120)
            },
        ),
        (
            "last_end_on_assistant",
            TrimOptions {
                end_on: vec![Role::Assistant],
                ..options(120)
            },
        ),
        (
            "last_allow_partial",
            TrimOptions {
                allow_partial: true,
                ..options(189)
            },
        ),
        (
            "last_tools_tokens",
            TrimOptions {
                tools_tokens: 40,
                ..options(120)
            },
        ),
        (
            "last_anthropic",
            TrimOptions {
                rules: Rules::Anthropic,
                ..options(120)
            },
        ),
        (
            "first",
            TrimOptions {
                strategy: Strategy::First,
                ..options(150)
            },
        ),
        (
            "first_end_on_user",
            TrimOptions {
                strategy: Strategy::First,
                end_on: vec![Role::User],
                ..options(140)
            },
        ),
        (
            "first_allow_partial",
            TrimOptions {
                strategy: Strategy::First,
                allow_partial: true,
                ..options(161)
            },
        ),
        (
            "head_tail",
            TrimOptions {
                strategy: Strategy::HeadTail { head: 1 },
                ..options(120)
            },
        ),
        (
            "head_tail_gemini",
            TrimOptions {
                strategy: Strategy::HeadTail { head: 1 },
                rules: Rules::Gemini,
                ..options(120)
            },
        ),
        (
            "hysteresis_under_high_water",
            TrimOptions {
                low_water: Some(100),
                ..options(320)
            },
        ),
        (
            "hysteresis_over_high_water",
            TrimOptions {
                low_water: Some(100),
                ..options(300)
            },
        ),
        ("error_fixed_too_large", options(25)),
        (
            "error_low_water_above_max",
            TrimOptions {
                low_water: Some(200),
                ..options(100)
            },
        ),
    ]
}

#[test]
fn each_trim_option_is_pinned_by_a_snapshot() {
    let pinned = conversation();
    let unpinned: Vec<Message> = conversation()
        .into_iter()
        .map(|mut m| {
            m.metadata.pinned = false;
            m
        })
        .collect();
    assert!(validate(&pinned, Rules::Anthropic).is_empty());
    for (name, options) in rows() {
        let messages = if name.starts_with("unpinned_") {
            &unpinned
        } else {
            &pinned
        };
        let result = trim(messages, &options, &COUNTER);
        if let Ok(trimmed) = &result {
            assert_eq!(validate(&trimmed.messages, options.rules), vec![], "{name}");
            assert!(
                trimmed.tokens_after <= u64::from(options.max_tokens),
                "{name}"
            );
        }
        insta::assert_snapshot!(format!("trim_{name}"), render(&result));
    }
}

#[test]
fn hysteresis_keeps_the_prefix_until_the_high_water_mark() {
    let options = TrimOptions {
        low_water: Some(150),
        ..options(250)
    };
    let mut history = trim(&conversation(), &options, &COUNTER).unwrap().messages;
    let prefix = history.clone();
    let mut calls = 0;
    loop {
        history.push(Message::assistant("Lyon, depuis 43 av. J.-C."));
        history.push(Message::user("Et Porto ?"));
        let trimmed = trim(&history, &options, &COUNTER).unwrap();
        calls += 1;
        if trimmed.over_budget {
            // Over the high-water mark: cut down to the low-water mark, once.
            assert!(trimmed.tokens_after <= 150);
            assert!(
                calls > 1,
                "the first appends stay under the high-water mark"
            );
            break;
        }
        // Under it: the request is sent as is, so its prefix is the same as last time.
        assert_eq!(trimmed.messages, history);
        assert_eq!(&trimmed.messages[..prefix.len()], prefix.as_slice());
    }
}

#[test]
fn the_slice_entry_point_does_not_tokenize_what_it_drops() {
    // A long history with nothing counted yet.
    let mut messages = vec![Message::system("You are terse.")];
    for i in 0..300 {
        messages.push(Message::user(format!("Question {i}: what is {i} squared?")));
        messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
            format!("c{i}"),
            "calc",
            format!("{{\"x\":{i}}}"),
        )]));
        messages.push(Message::tool_result(format!("c{i}"), format!("{}", i * i)));
        messages.push(Message::assistant(format!("{i} squared is {}.", i * i)));
    }
    let trimmed = trim(&messages, &options(300), &COUNTER).unwrap();
    assert!(trimmed.over_budget);
    let counted: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].cached_tokens(Encoding::O200kBase).is_some())
        .collect();
    let dropped_and_counted: Vec<usize> = trimmed
        .dropped_indices()
        .filter(|i| counted.contains(i))
        .collect();
    // Only the unit at the edge of the cut was counted among the dropped messages: here a
    // user message, or an assistant turn with its result.
    assert!(dropped_and_counted.len() <= 2, "{dropped_and_counted:?}");
    assert!(
        dropped_and_counted
            .iter()
            .all(|&i| i + 4 >= trimmed.dropped.last().unwrap().end)
    );
    assert_eq!(
        counted.len(),
        trimmed.messages.len() + dropped_and_counted.len()
    );
    assert_eq!(trimmed.tokens_before, None);
    assert!(trimmed.tokens_before_at_least > 300);
}

fn render_cleared(messages: &[Message], options: &ClearOptions) -> String {
    let cleared = clear_tool_results(messages, options, &COUNTER);
    let list: Vec<String> = cleared
        .cleared
        .iter()
        .map(|c| format!("{} {} `{}` -{}", c.index, c.tool_call_id, c.tool, c.tokens))
        .collect();
    format!(
        "triggered: {}\ncleared: [{}]\ntokens cleared: {}\n---\n{}",
        cleared.triggered,
        list.join(", "),
        cleared.tokens_cleared,
        render_messages(&cleared.messages)
    )
}

#[test]
fn each_clear_option_is_pinned_by_a_snapshot() {
    let messages = conversation();
    let rows = vec![
        (
            "keep_1",
            ClearOptions {
                keep_tool_uses: 1,
                ..ClearOptions::default()
            },
        ),
        (
            "keep_0_at_least_10",
            ClearOptions {
                keep_tool_uses: 0,
                clear_at_least: Some(10),
                ..ClearOptions::default()
            },
        ),
        (
            "exclude_search",
            ClearOptions {
                keep_tool_uses: 0,
                exclude_tools: vec!["search".into()],
                ..ClearOptions::default()
            },
        ),
        (
            "clear_arguments",
            ClearOptions {
                keep_tool_uses: 1,
                clear_arguments: true.into(),
                ..ClearOptions::default()
            },
        ),
        (
            "clear_arguments_of_search_only",
            ClearOptions {
                keep_tool_uses: 0,
                clear_arguments: ClearInputs::Tools(vec!["search".into()]),
                ..ClearOptions::default()
            },
        ),
        (
            "trigger_tool_uses_not_reached",
            ClearOptions {
                trigger: ClearTrigger::ToolUses(3),
                keep_tool_uses: 0,
                ..ClearOptions::default()
            },
        ),
        (
            "trigger_tokens_reached",
            ClearOptions {
                trigger: ClearTrigger::Tokens(300),
                keep_tool_uses: 1,
                ..ClearOptions::default()
            },
        ),
    ];
    for (name, options) in rows {
        let rendered = render_cleared(&messages, &options);
        insta::assert_snapshot!(format!("clear_{name}"), rendered);
    }
}
