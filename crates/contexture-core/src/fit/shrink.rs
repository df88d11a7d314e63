//! Making a request smaller before it is trimmed, the same way from one call to the next: tool
//! results cut to their start and end ([`TruncatePolicy`]), old ones cleared
//! ([`ClearPolicy`]), and, with [`Hysteresis`], the request cut down to a low mark once it
//! passes a high one, what was cut remembered ([`CutMemory`]) so that the following calls of
//! the same loop send the same prefix until the high mark is passed again.

use std::sync::Arc;

use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};

use crate::fit::clear::{
    Carried, ClearPolicy, ClearedResult, Replacements, carry_cleared, clear_tool_results_with,
    request_tokens, tool_use_count,
};
use crate::fit::truncate::{TruncatePolicy, TruncatedResult, truncate_tool_results};
use crate::fit::units::units;
use crate::message::{Message, Role};
use crate::tokens::TokenCounter;

/// When a request passes `high` of its limit (or, the first time in a loop, its clearing
/// trigger), it is cut down to `low` of its limit (or the trigger, when lower), not just
/// under the mark; what was cut stays cut in the next calls of the loop, and the next cut
/// waits for the high mark, so that the calls between share a byte-identical prefix
/// (provider prompt caches keep hitting). Shares in (0, 1], `low` below `high`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hysteresis {
    /// The share of the limit past which the request is cut.
    pub high: f64,
    /// The share of the limit it is cut down to.
    pub low: f64,
}

impl Hysteresis {
    /// What is wrong with it, as `(field, problem)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        for (field, share) in [("high", self.high), ("low", self.low)] {
            if !(share > 0.0 && share <= 1.0) {
                problems.push((
                    field,
                    format!("{field} must be greater than 0 and at most 1, not {share}"),
                ));
            }
        }
        if problems.is_empty() && self.low >= self.high {
            problems.push((
                "low",
                format!(
                    "low ({}) must be below high ({}): the request is cut from high down to low",
                    self.low, self.high
                ),
            ));
        }
        problems
    }
}

/// What the earlier calls of one loop cut, which the next call cuts again before anything
/// else (its prefix then stays what the earlier call sent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CutMemory {
    /// The calls whose results were cleared.
    pub cleared: FxHashSet<Arc<str>>,
    /// The placeholders and cleared calls made, counted once.
    pub replacements: Replacements,
    /// The history's first messages left out (whole units): a history that changed since
    /// (a compaction) starts over.
    pub history_dropped: Option<HistoryCut>,
}

/// Where an earlier call of a loop cut the history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryCut {
    /// How many of its first messages were left out.
    pub dropped: usize,
    /// Its length then.
    pub length: usize,
    /// The first message kept.
    pub first_kept: Option<Message>,
}

impl HistoryCut {
    /// How many of `history`'s first messages to leave out again: the same, when it is
    /// still the history this cut was made in.
    fn again(&self, history: &[Message]) -> usize {
        let same = history.len() == self.length
            && self.dropped <= history.len()
            && history.get(self.dropped) == self.first_kept.as_ref();
        if same { self.dropped } else { 0 }
    }
}

/// How a request is made smaller before trimming.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShrinkPolicy<'a> {
    /// Tool results cut to their start and end.
    pub truncate: Option<&'a TruncatePolicy>,
    /// Old tool results cleared.
    pub clear: Option<&'a ClearPolicy>,
    /// Cut from a high mark down to a low one.
    pub hysteresis: Option<&'a Hysteresis>,
    /// True when the history's oldest messages go first (the `last` strategy): only then
    /// does hysteresis leave history out itself; otherwise trimming does.
    pub history_oldest_first: bool,
}

/// A request made smaller.
#[derive(Debug, Clone, PartialEq)]
pub struct Shrunk {
    /// The system prompt, the history kept and the request's own messages, in order.
    pub messages: Vec<Message>,
    /// Where the request's own messages start in `messages`.
    pub own_from: usize,
    /// How many of the history's first messages were left out.
    pub history_dropped: usize,
    /// The results cut to their start and end.
    pub truncated: Vec<TruncatedResult>,
    /// The results cleared (their indexes in `messages`).
    pub cleared: Vec<ClearedResult>,
}

/// The parts of a request, as [`shrink`] takes them.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// The system prompt.
    pub system: Option<&'a Message>,
    /// The history, oldest first.
    pub history: &'a [Message],
    /// The request's own messages (a step's task and tool loop), kept whole.
    pub own: &'a [Message],
    /// The most tokens the request may use.
    pub limit: u32,
    /// The tokens of the tool schemas sent with it.
    pub tools_tokens: u32,
}

/// Makes `request` smaller by `policy`, cutting first what `memory` says earlier calls cut,
/// and remembering what it cuts.
pub fn shrink(
    request: &RequestParts<'_>,
    policy: &ShrinkPolicy<'_>,
    memory: &mut CutMemory,
    counter: &TokenCounter,
) -> Shrunk {
    let RequestParts {
        system,
        history,
        own,
        limit,
        tools_tokens,
    } = *request;
    let high = policy
        .hysteresis
        .map(|h| (f64::from(limit) * h.high).floor() as u64);
    let low = policy
        .hysteresis
        .map(|h| (f64::from(limit) * h.low).floor() as u64);
    // History left out by earlier calls, unless it changed since.
    let mut dropped = memory
        .history_dropped
        .as_ref()
        .map_or(0, |cut| cut.again(history));
    let assemble = |dropped: usize| {
        let mut all = Vec::with_capacity(history.len() - dropped + own.len() + 1);
        all.extend(system.cloned());
        all.extend(history[dropped..].iter().cloned());
        all.extend(own.iter().cloned());
        all
    };
    let system_len = usize::from(system.is_some());
    let cut_before = !memory.cleared.is_empty() || memory.history_dropped.is_some();
    // What earlier calls cleared is put in while the request is copied: a result cleared
    // again is never copied (nor cut below).
    let Carried {
        messages: mut all,
        mut cleared,
        left,
    } = match policy.clear {
        Some(clear) if !memory.cleared.is_empty() => carry_cleared(
            system.into_iter().chain(&history[dropped..]).chain(own),
            &memory.cleared,
            &memory.replacements,
            &clear.clear_inputs,
        ),
        _ => Carried {
            messages: assemble(dropped),
            cleared: Vec::new(),
            left: false,
        },
    };
    let mut truncated = Vec::new();
    if let Some(truncate) = policy.truncate {
        let cut = truncate_tool_results(&all, truncate, counter);
        all = cut.messages;
        truncated = cut.truncated;
    }
    let tokens = |messages: &[Message]| request_tokens(messages, tools_tokens, counter);
    if let Some(clear) = policy.clear {
        let options = clear.options(tools_tokens);
        // What earlier calls cleared and copying could not put in; then whether this
        // request still passes a mark.
        if left {
            let carried = clear_tool_results_with(
                all,
                &options,
                &memory.cleared,
                (false, None),
                &mut memory.replacements,
                counter,
            );
            all = carried.messages;
            cleared.extend(carried.cleared);
            cleared.sort_by_key(|result| result.index);
        }
        let total = tokens(&all);
        let trigger = clear.token_trigger();
        let uses = tool_use_count(&all);
        // The first cut of a loop comes past the trigger; under hysteresis, the next ones
        // only past the high mark, so that the calls between share their prefix (a
        // tool-use trigger too, once a loop was cut).
        let by_tokens = match high {
            Some(high) if cut_before => total > high.max(trigger),
            Some(high) => total > high.min(trigger),
            None => clear.trigger_tokens.is_some_and(|limit| total > limit),
        };
        let by_uses = clear.fires(0, uses)
            && match high {
                Some(high) if cut_before => total > high,
                _ => true,
            };
        // Past a token mark: under hysteresis, down to the low mark (or the trigger, when
        // lower); else to the token trigger, or every older result when no least amount is
        // set. Past the tool-use trigger alone: every older result.
        let stop_below = match (by_tokens, low) {
            (false, _) => None,
            (true, Some(low)) => Some(low.min(trigger)),
            (true, None) => clear.clear_at_least.and(clear.trigger_tokens),
        };
        if by_tokens || by_uses {
            // A clearing that would free less than the policy's least is not made.
            let unchanged = clear.min_cleared.map(|_| all.clone());
            let more = clear_tool_results_with(
                all,
                &options,
                &FxHashSet::default(),
                (true, stop_below),
                &mut memory.replacements,
                counter,
            );
            match unchanged {
                Some(unchanged)
                    if clear
                        .min_cleared
                        .is_some_and(|least| more.tokens_cleared < least) =>
                {
                    all = unchanged;
                }
                _ => {
                    // Only calls cleared now are new to the memory: the others were carried.
                    memory.cleared.extend(
                        more.cleared
                            .iter()
                            .map(|result| Arc::clone(&result.tool_call_id)),
                    );
                    all = more.messages;
                    cleared.extend(more.cleared);
                    cleared.sort_by_key(|result| result.index);
                }
            }
        }
    }
    // Still past the high mark: the oldest history goes, whole units, down to the low mark.
    if let (Some(high), Some(low)) = (high, low)
        && policy.history_oldest_first
        && tokens(&all) > high
    {
        let kept = &history[dropped..];
        let mut total = tokens(&all);
        let mut more = 0;
        for unit in units(kept) {
            // What is kept starts on a user turn, as every provider wants the first turn.
            if total <= low && kept[unit.messages().start].role == Role::User {
                break;
            }
            let range = unit.messages();
            let first = system_len + range.start;
            total = total.saturating_sub(
                all[first..system_len + range.end]
                    .iter()
                    .map(|m| u64::from(counter.count_message(m)))
                    .sum(),
            );
            more = range.end;
        }
        if more > 0 {
            all.drain(system_len..system_len + more);
            // Results that went with the history are no longer cleared in this request.
            cleared.retain(|result| result.index >= system_len + more);
            truncated.retain(|result| {
                all.iter()
                    .any(|m| m.tool_call_id.as_deref() == Some(&result.tool_call_id))
            });
            for result in &mut cleared {
                result.index -= more;
            }
            dropped += more;
        }
    }
    memory.history_dropped = (dropped > 0).then(|| HistoryCut {
        dropped,
        length: history.len(),
        first_kept: history.get(dropped).cloned(),
    });
    Shrunk {
        own_from: all.len() - own.len(),
        messages: all,
        history_dropped: dropped,
        truncated,
        cleared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::validate::{Rules, validate};
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        }
    }

    /// A task, then `calls` tool uses whose results are about 500 tokens each.
    fn own(calls: usize) -> Vec<Message> {
        let mut own = vec![Message::user("Read every page.")];
        for call in 0..calls {
            let id = format!("call-{call}");
            own.push(Message::assistant_tool_calls(vec![ToolCall::new(
                id.clone(),
                "fetch",
                "{}",
            )]));
            let page: String = (0..70)
                .map(|line| format!("line {line} of {call}\n"))
                .collect();
            own.push(Message::tool_result(id, page));
        }
        own
    }

    /// The requests a loop of `calls` calls sends, and how many repeat the previous one
    /// whole at their start.
    fn run(policy: &ShrinkPolicy<'_>, calls: usize) -> (Vec<Vec<Message>>, usize) {
        let counter = counter();
        let mut memory = CutMemory::default();
        let system = Message::system("You read pages.");
        let mut sent: Vec<Vec<Message>> = Vec::new();
        let mut stable = 0;
        for call in 0..calls {
            let own = own(call);
            let request = RequestParts {
                system: Some(&system),
                history: &[],
                own: &own,
                limit: 4_000,
                tools_tokens: 0,
            };
            let shrunk = shrink(&request, policy, &mut memory, &counter);
            assert_eq!(validate(&shrunk.messages, Rules::OpenAi), vec![]);
            if let Some(previous) = sent.last()
                && shrunk.messages.starts_with(previous)
            {
                stable += 1;
            }
            sent.push(shrunk.messages);
        }
        (sent, stable)
    }

    #[test]
    fn hysteresis_cuts_down_to_the_low_mark_and_the_next_calls_keep_the_cut() {
        let clear = ClearPolicy {
            trigger_tokens: Some(3_000),
            trigger_tool_uses: None,
            min_cleared: None,
            keep: 1,
            clear_at_least: Some(400),
            exclude_tools: Vec::new(),
            clear_inputs: false.into(),
        };
        let hysteresis = Hysteresis {
            high: 0.9,
            low: 0.4,
        };
        let with = ShrinkPolicy {
            clear: Some(&clear),
            hysteresis: Some(&hysteresis),
            ..ShrinkPolicy::default()
        };
        let without = ShrinkPolicy {
            clear: Some(&clear),
            ..ShrinkPolicy::default()
        };
        let counter = counter();
        let (sent, stable) = run(&with, 30);
        let (_, stable_without) = run(&without, 30);
        for request in &sent {
            let tokens = u64::from(counter.count_request(request, &[]).total);
            assert!(tokens <= 3_000 + 600, "{tokens}");
        }
        assert!(
            stable > stable_without + 5,
            "{stable} stable prefixes with hysteresis, {stable_without} without"
        );
        // The newest result is never cleared; the task is always there.
        for request in &sent[1..] {
            let last = request.last().unwrap();
            assert!(!crate::fit::is_cleared_placeholder(&last.text()));
            assert_eq!(request[1].text(), "Read every page.");
        }
    }

    #[test]
    fn history_goes_whole_units_oldest_first_down_to_the_low_mark_and_stays_out() {
        let counter = counter();
        let history: Vec<Message> = (0..40)
            .flat_map(|turn| {
                [
                    Message::user(format!("question {turn}: {}", "why ".repeat(40))),
                    Message::assistant(format!("answer {turn}: {}", "because ".repeat(40))),
                ]
            })
            .collect();
        let hysteresis = Hysteresis {
            high: 0.9,
            low: 0.5,
        };
        let policy = ShrinkPolicy {
            hysteresis: Some(&hysteresis),
            history_oldest_first: true,
            ..ShrinkPolicy::default()
        };
        let mut memory = CutMemory::default();
        let parts = |history, own| RequestParts {
            system: None,
            history,
            own,
            limit: 4_000,
            tools_tokens: 0,
        };
        let task = own(0);
        let first = shrink(&parts(&history, &task), &policy, &mut memory, &counter);
        assert!(first.history_dropped > 0 && first.history_dropped.is_multiple_of(2));
        let tokens = u64::from(counter.count_request(&first.messages, &[]).total);
        assert!(tokens <= 2_000, "{tokens}");
        // A small step later the same history is left out: the prefix is the same.
        let mut more = own(0);
        more.push(Message::assistant("a short note"));
        let second = shrink(&parts(&history, &more), &policy, &mut memory, &counter);
        assert_eq!(second.history_dropped, first.history_dropped);
        assert!(second.messages.starts_with(&first.messages));
        // A history that changed (a compaction) starts over.
        let compacted = &history[10..];
        let third = shrink(&parts(compacted, &more), &policy, &mut memory, &counter);
        assert_ne!(third.messages[0], second.messages[0]);
    }

    /// What one request of a loop of `calls` tool uses clears under `clear`, with or
    /// without the marks: the calls whose results it cleared.
    fn cleared_by(clear: &ClearPolicy, marks: Option<&Hysteresis>, calls: usize) -> Vec<String> {
        let system = Message::system("You read pages.");
        let own = own(calls);
        let request = RequestParts {
            system: Some(&system),
            history: &[],
            own: &own,
            limit: 100_000,
            tools_tokens: 0,
        };
        let policy = ShrinkPolicy {
            clear: Some(clear),
            hysteresis: marks,
            history_oldest_first: true,
            ..ShrinkPolicy::default()
        };
        let shrunk = shrink(&request, &policy, &mut CutMemory::default(), &counter());
        shrunk
            .cleared
            .iter()
            .map(|result| result.tool_call_id.to_string())
            .collect()
    }

    #[test]
    fn a_tool_use_trigger_clears_all_but_the_kept_under_the_marks_too() {
        let clear = ClearPolicy {
            trigger_tokens: None,
            trigger_tool_uses: Some(4),
            ..ClearPolicy::past_tokens(1)
        };
        let marks = Hysteresis {
            high: 0.9,
            low: 0.6,
        };
        // Five uses of a request far under the marks: the two oldest are cleared all the
        // same (all but the newest three), with the marks or without.
        for marks in [None, Some(&marks)] {
            assert_eq!(cleared_by(&clear, marks, 5), ["call-0", "call-1"]);
            assert_eq!(cleared_by(&clear, marks, 4), Vec::<String>::new());
        }
    }

    #[test]
    fn a_clearing_that_frees_less_than_the_least_is_not_made() {
        let clear = |least| ClearPolicy {
            min_cleared: Some(least),
            ..ClearPolicy::past_tokens(1)
        };
        // Five uses, three kept: two results of about 500 tokens each can be freed.
        assert_eq!(cleared_by(&clear(500), None, 5), ["call-0", "call-1"]);
        assert_eq!(cleared_by(&clear(5_000), None, 5), Vec::<String>::new());
        assert!(
            clear(0)
                .problems()
                .iter()
                .any(|(field, _)| *field == "min_cleared")
        );
    }

    #[test]
    fn marks_that_cannot_work_are_refused() {
        let problems = |high, low| Hysteresis { high, low }.problems();
        assert!(problems(0.9, 0.6).is_empty());
        assert_eq!(problems(0.6, 0.9)[0].0, "low");
        assert_eq!(problems(1.5, 0.5)[0].0, "high");
        assert_eq!(problems(0.9, 0.0)[0].0, "low");
    }
}
