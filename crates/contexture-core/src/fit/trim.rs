//! Trimming a history to a token budget.
//!
//! The budget bounds the whole request as [`TokenCounter::count_request`] counts it: every
//! kept message, the reply priming, and the tool schemas (`tools_tokens`). The system prompt
//! and pinned units are budgeted first and always kept; the rest is chosen by the
//! [`Strategy`] in whole units (an assistant turn with its tool results), so a trimmed history
//! never holds a result without its call or a call without its result.
//!
//! **Hysteresis.** With a `low_water` mark, a request at or under `max_tokens` is left alone;
//! one over it is cut down to `low_water`. A caller that keeps the trimmed history and
//! appends to it then sends the same prefix on every call until the request grows past
//! `max_tokens` again, so provider prompt caches keep hitting.
//!
//! **Cost.** Fitting reads the counts of the units it keeps, of the system and pinned units,
//! and of the one unit at each edge of the cut that did not fit (a unit cannot be known not
//! to fit without counting it). [`IndexedHistory::fit`] reads them from its index, so a fit
//! costs O(kept units + pinned units), not O(history). [`trim`] on a plain slice counts
//! lazily, walking from the edge of the kept region inward: messages it drops are never
//! tokenized, except that edge unit (and, with `low_water`, the units between the two marks,
//! which must be counted to learn the request is over `max_tokens`).
//!
//! **Validity.** Every output passes [`validate`](super::validate()) for the chosen provider.
//! Where the provider requires alternation, the kept history starts on a user turn (unless
//! `start_on` says otherwise), a pinned assistant turn keeps the user turn before it, and
//! turns that become adjacent (around a pinned message or the head+tail marker) are merged
//! by [`repair`](super::repair()); changes made that way are reported in
//! [`Trimmed::repairs`]. Anything still invalid is an error, never an output.

use std::ops::Range;

use super::repair::{RepairChange, repair};
use super::units::{IndexedHistory, Segmenter, Unit};
use super::validate::{Rules, Violation, validate_refs};
use crate::message::{Content, Message, Part, Role};
use crate::tokens::{REPLY_PRIMING, TokenCounter};

/// Which part of the history to keep.
///
/// Written (in YAML, configuration, query strings and on the command line) as `last`,
/// `first`, `head-tail` (keeping [`Strategy::DEFAULT_HEAD`] units at the start) or
/// `head-tail:N`; [`FromStr`](std::str::FromStr), [`Display`](std::fmt::Display) and serde
/// use that one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// The most recent units that fit.
    #[default]
    Last,
    /// The oldest units that fit.
    First,
    /// The first `head` units after the system prompt, then the most recent units that fit,
    /// with one marker message "[k earlier messages omitted]" between them (its tokens are
    /// budgeted).
    HeadTail {
        /// How many units to keep at the start (fewer when they do not fit).
        head: usize,
    },
}

impl Strategy {
    /// The units `head-tail` keeps at the start when it names no number: the opening turn
    /// (a conversation's first question, a run's input).
    pub const DEFAULT_HEAD: usize = 1;
}

/// A strategy name that is not one of `last`, `first`, `head-tail`, `head-tail:N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy `{name}` (expected last, first, head-tail or head-tail:N){hint}")]
pub struct UnknownStrategy {
    /// The name that was given.
    pub name: String,
    hint: &'static str,
}

impl std::str::FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(name: &str) -> Result<Strategy, UnknownStrategy> {
        let unknown = |hint| UnknownStrategy {
            name: name.to_owned(),
            hint,
        };
        match name {
            "last" => Ok(Strategy::Last),
            "first" => Ok(Strategy::First),
            "head-tail" => Ok(Strategy::HeadTail {
                head: Strategy::DEFAULT_HEAD,
            }),
            "head_tail" => Err(unknown("; it is spelled `head-tail`")),
            _ => match name.strip_prefix("head-tail:") {
                Some(head) => head
                    .parse()
                    .map(|head| Strategy::HeadTail { head })
                    .map_err(|_| unknown("; N is the number of units kept at the start")),
                None => Err(unknown("")),
            },
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Strategy::Last => f.write_str("last"),
            Strategy::First => f.write_str("first"),
            Strategy::HeadTail { head } => write!(f, "head-tail:{head}"),
        }
    }
}

impl serde::Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Strategy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Strategy, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// How to trim. Start from [`TrimOptions::new`] and set fields with struct update syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrimOptions {
    /// The most tokens the request may take (messages, reply priming and tool schemas).
    pub max_tokens: u32,
    /// Hysteresis: when the request is over `max_tokens`, cut down to this many tokens
    /// instead of just under `max_tokens`. `None` cuts to `max_tokens`.
    pub low_water: Option<u32>,
    /// Tokens of the tool schemas sent with the request (see
    /// [`tools_tokens`](crate::tokens::tools_tokens)).
    pub tools_tokens: u32,
    /// Which part of the history to keep.
    pub strategy: Strategy,
    /// Keep the leading system (or developer) messages. Default true.
    pub keep_system: bool,
    /// The roles the kept history may start with (after the system prompt). Empty: any role,
    /// except that providers requiring alternation start on a user turn.
    pub start_on: Vec<Role>,
    /// The roles the kept history may end with. Empty: any role. Trailing units are dropped
    /// until one ends with such a role; a pinned unit stops the search.
    pub end_on: Vec<Role>,
    /// Use leftover budget for part of one more message, cut at line breaks: the end of the
    /// next older message for [`Strategy::Last`], the start of the next newer one for
    /// [`Strategy::First`]. Only a plain text message is cut, never a tool call or result.
    pub allow_partial: bool,
    /// Whose rules the output must follow.
    pub rules: Rules,
}

impl TrimOptions {
    /// Options for a budget of `max_tokens`: strategy last, system kept, no hysteresis, no
    /// tools, OpenAI rules.
    pub fn new(max_tokens: u32) -> TrimOptions {
        TrimOptions {
            max_tokens,
            low_water: None,
            tools_tokens: 0,
            strategy: Strategy::Last,
            keep_system: true,
            start_on: Vec::new(),
            end_on: Vec::new(),
            allow_partial: false,
            rules: Rules::OpenAi,
        }
    }
}

/// A trimmed history and what trimming did.
#[derive(Debug, Clone, PartialEq)]
pub struct Trimmed {
    /// The kept messages, in order (with the head+tail marker and a partial message, if any).
    pub messages: Vec<Message>,
    /// The dropped messages as ranges of original indices, ascending.
    pub dropped: Vec<Range<usize>>,
    /// The original index of the message that was kept only in part (`allow_partial`).
    pub partial: Option<usize>,
    /// The position in [`Trimmed::messages`] of the head+tail marker, if one was inserted.
    pub marker: Option<usize>,
    /// True when the request was over `max_tokens` and was cut to the target.
    pub over_budget: bool,
    /// The request's tokens before trimming, when every message was counted (always with
    /// [`IndexedHistory::fit`]; with [`trim`] only when nothing had to be cut).
    pub tokens_before: Option<u64>,
    /// A lower bound of the request's tokens before trimming: the tokens of every message
    /// that was counted, plus reply priming and tool schemas.
    pub tokens_before_at_least: u64,
    /// The request's tokens after trimming.
    pub tokens_after: u64,
    /// Changes made to satisfy the provider's rules after the cut (merged turns); indices
    /// refer to the kept list before those changes.
    pub repairs: Vec<RepairChange>,
}

impl Trimmed {
    /// How many original messages were dropped.
    pub fn dropped_count(&self) -> usize {
        self.dropped.iter().map(ExactSizeIterator::len).sum()
    }

    /// The dropped original indices, ascending.
    pub fn dropped_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.dropped.iter().flat_map(Clone::clone)
    }
}

/// Why a history could not be trimmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrimError {
    /// The system prompt and pinned messages alone (with reply priming and tool schemas) are
    /// over the budget.
    #[error(
        "the system prompt and pinned messages need {required} tokens (with reply priming and tool schemas), over the budget of {max_tokens}"
    )]
    FixedTooLarge {
        /// Tokens of the system prompt, pinned units, reply priming and tool schemas.
        required: u64,
        /// The budget.
        max_tokens: u32,
    },
    /// The low-water mark is above the budget.
    #[error("the low-water mark {low_water} is above the budget of {max_tokens} tokens")]
    LowWaterAboveMax {
        /// The low-water mark.
        low_water: u32,
        /// The budget.
        max_tokens: u32,
    },
    /// The kept messages break the provider's rules in a way repair cannot fix (for
    /// example a pinned assistant turn with no user turn before it).
    #[error("the trimmed history breaks {rules} rules that repair cannot fix: {}", first_violation(.violations))]
    Unrepairable {
        /// The provider.
        rules: Rules,
        /// What is still wrong, with indices into the repaired list.
        violations: Vec<Violation>,
    },
    /// The trimmed request is still over the budget (only possible when the input breaks the
    /// provider's rules and repair had to add results).
    #[error("the trimmed request needs {tokens} tokens, over the budget of {max_tokens}")]
    OverBudget {
        /// The request's tokens after trimming.
        tokens: u64,
        /// The budget.
        max_tokens: u32,
    },
}

fn first_violation(violations: &[Violation]) -> String {
    match violations {
        [] => "no details".to_owned(),
        [only] => only.to_string(),
        [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
    }
}

/// Trims `messages` to `options` with counts from `counter`, counting lazily: see the module
/// documentation for which messages are tokenized. Builds the unit segmentation (no
/// tokenization) on every call; callers that fit the same growing history repeatedly should
/// keep an [`IndexedHistory`].
pub fn trim(
    messages: &[Message],
    options: &TrimOptions,
    counter: &TokenCounter,
) -> Result<Trimmed, TrimError> {
    let mut segmenter = Segmenter::default();
    for (index, message) in messages.iter().enumerate() {
        segmenter.push(index, message);
    }
    let costs = LazyCosts {
        messages,
        units: &segmenter.units,
        counter,
        seen: vec![false; segmenter.units.len()],
        counted: 0,
        counted_units: 0,
    };
    Fitter::new(messages, &segmenter, costs, options, counter).run()
}

impl IndexedHistory {
    /// Trims the history to `options` (see [`trim`]), reading unit costs from the index: the
    /// work is proportional to the units kept plus the pinned and system units.
    pub fn fit(&self, options: &TrimOptions) -> Result<Trimmed, TrimError> {
        let costs = IndexedCosts { history: self };
        Fitter::new(
            self.messages(),
            self.segmenter(),
            costs,
            options,
            self.counter(),
        )
        .run()
    }
}

/// Where unit costs come from.
trait Costs {
    /// The tokens of unit `unit`.
    fn cost(&mut self, unit: usize) -> u64;
    /// The tokens of all messages, when all were counted.
    fn total(&self) -> Option<u64>;
    /// The tokens of the messages counted so far.
    fn counted(&self) -> u64;
}

struct IndexedCosts<'a> {
    history: &'a IndexedHistory,
}

impl Costs for IndexedCosts<'_> {
    fn cost(&mut self, unit: usize) -> u64 {
        self.history.unit_tokens(unit)
    }
    fn total(&self) -> Option<u64> {
        Some(self.history.message_tokens())
    }
    fn counted(&self) -> u64 {
        self.history.message_tokens()
    }
}

struct LazyCosts<'a> {
    messages: &'a [Message],
    units: &'a [Unit],
    counter: &'a TokenCounter,
    seen: Vec<bool>,
    counted: u64,
    counted_units: usize,
}

impl Costs for LazyCosts<'_> {
    fn cost(&mut self, unit: usize) -> u64 {
        let cost = self.messages[self.units[unit].messages()]
            .iter()
            .map(|message| u64::from(self.counter.count_message(message)))
            .sum();
        if !self.seen[unit] {
            self.seen[unit] = true;
            self.counted += cost;
            self.counted_units += 1;
        }
        cost
    }
    fn total(&self) -> Option<u64> {
        (self.counted_units == self.units.len()).then_some(self.counted)
    }
    fn counted(&self) -> u64 {
        self.counted
    }
}

/// What the strategy chose: kept units (ascending), a partial unit and a marker position.
struct Plan {
    kept: Vec<usize>,
    partial: Option<(usize, Message)>,
    /// The marker goes before the first kept unit at or after this unit index.
    marker: Option<(usize, usize)>,
    over: bool,
}

struct Fitter<'a, C> {
    messages: &'a [Message],
    units: &'a [Unit],
    pinned: &'a [usize],
    costs: C,
    options: &'a TrimOptions,
    counter: &'a TokenCounter,
    /// Units `0..sys_end` are the kept system prompt.
    sys_end: usize,
    /// Units kept so that a pinned assistant turn has its user turn before it.
    anchor: Range<usize>,
}

impl<'a, C: Costs> Fitter<'a, C> {
    fn new(
        messages: &'a [Message],
        segmenter: &'a Segmenter,
        costs: C,
        options: &'a TrimOptions,
        counter: &'a TokenCounter,
    ) -> Self {
        let units = &segmenter.units;
        let sys_end = if options.keep_system {
            segmenter.system_units
        } else {
            0
        };
        let mut anchor = 0..0;
        if options.rules.requires_alternation()
            && let Some(&first) = segmenter
                .pinned
                .iter()
                .find(|&&unit| unit >= sys_end && !units[unit].first_role.is_system_like())
            && units[first].first_role != Role::User
            && let Some(user) = (sys_end..first)
                .rev()
                .find(|&unit| units[unit].first_role == Role::User)
        {
            anchor = user..first;
        }
        Fitter {
            messages,
            units,
            pinned: &segmenter.pinned,
            costs,
            options,
            counter,
            sys_end,
            anchor,
        }
    }

    fn fixed(&self, unit: usize) -> bool {
        unit < self.sys_end || self.units[unit].pinned || self.anchor.contains(&unit)
    }

    /// The always-kept units, ascending.
    fn fixed_units(&self) -> Vec<usize> {
        let mut fixed: Vec<usize> = (0..self.sys_end)
            .chain(self.anchor.clone())
            .chain(self.pinned.iter().copied())
            .collect();
        fixed.sort_unstable();
        fixed.dedup();
        fixed
    }

    fn start_ok(&self, role: Role) -> bool {
        if !self.options.start_on.is_empty() {
            self.options.start_on.contains(&role)
        } else if self.options.rules.requires_alternation() {
            role == Role::User
        } else {
            true
        }
    }

    /// Walks from `end` back towards `floor` over the non-fixed units while their costs fit
    /// `budget` (starting from `acc`). Returns the first kept unit, the sum, and whether a
    /// unit did not fit.
    fn walk_back(
        &mut self,
        floor: usize,
        end: usize,
        budget: u64,
        mut acc: u64,
    ) -> (usize, u64, bool) {
        for unit in (floor..end).rev() {
            if self.fixed(unit) {
                continue;
            }
            let cost = self.costs.cost(unit);
            if acc + cost > budget {
                return (unit + 1, acc, true);
            }
            acc += cost;
        }
        (floor, acc, false)
    }

    /// Walks from `start` forward over the non-fixed units while they fit. Returns the first
    /// unit not kept, the sum, and whether a unit did not fit.
    fn walk_forward(&mut self, start: usize, budget: u64, mut acc: u64) -> (usize, u64, bool) {
        for unit in start..self.units.len() {
            if self.fixed(unit) {
                continue;
            }
            let cost = self.costs.cost(unit);
            if acc + cost > budget {
                return (unit, acc, true);
            }
            acc += cost;
        }
        (self.units.len(), acc, false)
    }

    /// Moves `start` past units the kept history may not start with, unless a fixed unit
    /// after the system prompt already comes first.
    fn apply_start_on(&self, mut start: usize, end: usize, fixed: &[usize]) -> usize {
        if fixed.iter().any(|&unit| {
            unit >= self.sys_end && unit < start && !self.units[unit].first_role.is_system_like()
        }) {
            return start;
        }
        while start < end && !self.fixed(start) && !self.start_ok(self.units[start].first_role) {
            start += 1;
        }
        start
    }

    /// Moves `end` back past units the kept history may not end with (stopping at a fixed
    /// unit).
    fn apply_end_on(&self, floor: usize, mut end: usize) -> usize {
        if self.options.end_on.is_empty() {
            return end;
        }
        while end > floor
            && !self.fixed(end - 1)
            && !self.options.end_on.contains(&self.units[end - 1].last_role)
        {
            end -= 1;
        }
        end
    }

    fn run(mut self) -> Result<Trimmed, TrimError> {
        let options = self.options;
        let max = u64::from(options.max_tokens);
        if let Some(low_water) = options.low_water
            && low_water > options.max_tokens
        {
            return Err(TrimError::LowWaterAboveMax {
                low_water,
                max_tokens: options.max_tokens,
            });
        }
        let overhead = u64::from(REPLY_PRIMING) + u64::from(options.tools_tokens);
        let fixed = self.fixed_units();
        let fixed_cost: u64 = fixed.iter().map(|&unit| self.costs.cost(unit)).sum();
        let required = fixed_cost + overhead;
        if required > max {
            return Err(TrimError::FixedTooLarge {
                required,
                max_tokens: options.max_tokens,
            });
        }
        let high = max - required;
        let low =
            u64::from(options.low_water.unwrap_or(options.max_tokens)).saturating_sub(required);
        let floor = self.sys_end;
        let n = self.units.len();

        let plan = match options.strategy {
            Strategy::Last => {
                let end = self.apply_end_on(floor, n);
                let (mut start, mut acc, over) = self.walk_back(floor, end, high, 0);
                if over {
                    (start, acc, _) = self.walk_back(floor, end, low, 0);
                }
                let cut = start;
                start = self.apply_start_on(start, end, &fixed);
                for unit in cut..start {
                    acc -= self.costs.cost(unit);
                }
                let mut partial = None;
                if over && options.allow_partial && start == cut && start > floor {
                    let candidate = start - 1;
                    if self.start_ok(self.units[candidate].first_role) {
                        partial = self.partial(candidate, low - acc, true);
                    }
                }
                Plan {
                    kept: combine(&fixed, start..end, 0..0),
                    partial,
                    marker: None,
                    over,
                }
            }
            Strategy::First => {
                let start = self.apply_start_on(floor, n, &fixed);
                let (mut end, mut acc, over) = self.walk_forward(start, high, 0);
                if over {
                    (end, acc, _) = self.walk_forward(start, low, 0);
                }
                let cut = end;
                end = self.apply_end_on(start, end);
                for unit in end..cut {
                    if !self.fixed(unit) {
                        acc -= self.costs.cost(unit);
                    }
                }
                let mut partial = None;
                if over && options.allow_partial && end == cut && end < n && !self.fixed(end) {
                    partial = self.partial(end, low - acc, false);
                }
                Plan {
                    kept: combine(&fixed, start..end, 0..0),
                    partial,
                    marker: None,
                    over,
                }
            }
            Strategy::HeadTail { head } => {
                let start = self.apply_start_on(floor, n, &fixed);
                let end = self.apply_end_on(start, n);
                let (_, _, over) = self.walk_back(start, end, high, 0);
                if !over {
                    Plan {
                        kept: combine(&fixed, start..end, 0..0),
                        partial: None,
                        marker: None,
                        over,
                    }
                } else {
                    // The marker's count grows with its number; reserve the larger of the
                    // singular form and the largest possible number.
                    let reserve = [1, self.messages.len()]
                        .into_iter()
                        .map(|k| u64::from(self.counter.count_message(&marker_message(k))))
                        .max()
                        .unwrap_or(0);
                    if reserve > low {
                        // No room for the marker: keep the most recent units that fit.
                        let (tail_start, _, _) = self.walk_back(start, end, low, 0);
                        return self.finish(
                            Plan {
                                kept: combine(&fixed, tail_start..end, 0..0),
                                partial: None,
                                marker: None,
                                over,
                            },
                            overhead,
                        );
                    }
                    let budget = low.saturating_sub(reserve);
                    let mut acc = 0;
                    let mut taken = 0;
                    let mut head_end = start;
                    for unit in start..end {
                        if taken == head {
                            break;
                        }
                        if self.fixed(unit) {
                            head_end = unit + 1;
                            continue;
                        }
                        let cost = self.costs.cost(unit);
                        if acc + cost > budget {
                            break;
                        }
                        acc += cost;
                        taken += 1;
                        head_end = unit + 1;
                    }
                    let (tail_start, _, _) = self.walk_back(head_end, end, budget, acc);
                    let omitted = self.omitted_messages(head_end, tail_start);
                    Plan {
                        kept: combine(&fixed, start..head_end, tail_start..end),
                        partial: None,
                        marker: (omitted > 0).then_some((head_end, omitted)),
                        over,
                    }
                }
            }
        };
        self.finish(plan, overhead)
    }

    /// Messages of the non-fixed units in `from..to`.
    fn omitted_messages(&self, from: usize, to: usize) -> usize {
        if from >= to {
            return 0;
        }
        let span = self.units[to - 1].end - self.units[from].start;
        let fixed: usize = self
            .pinned
            .iter()
            .copied()
            .chain(self.anchor.clone())
            .filter(|&unit| unit >= from && unit < to)
            .map(|unit| self.units[unit].len())
            .sum();
        span - fixed
    }

    /// Part of unit `unit`'s text fitting `leftover` tokens, cut at line breaks: the last
    /// lines when `keep_end`, else the first lines. `None` when the unit is not a single
    /// plain-text message or not even one line fits.
    fn partial(&self, unit: usize, leftover: u64, keep_end: bool) -> Option<(usize, Message)> {
        let unit_info = self.units[unit];
        if unit_info.len() != 1 || self.fixed(unit) {
            return None;
        }
        let message = &self.messages[unit_info.start];
        let text_only = match &message.content {
            Some(Content::Text(_)) => true,
            Some(Content::Parts(parts)) => {
                parts.iter().all(|part| matches!(part, Part::Text { .. }))
            }
            None => false,
        };
        if message.role == Role::Tool
            || !message.tool_calls.is_empty()
            || message.tool_call_id.is_some()
            || !text_only
        {
            return None;
        }
        let text = message.text();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let cut = |keep: usize| -> Message {
            let kept = if keep_end {
                lines[lines.len() - keep..].concat()
            } else {
                let kept = lines[..keep].concat();
                kept.strip_suffix('\n').map(str::to_owned).unwrap_or(kept)
            };
            let mut cut = message.clone();
            cut.set_text(kept);
            cut
        };
        // Largest number of lines (fewer than all) whose message fits.
        let mut best = None;
        let (mut lo, mut hi) = (1usize, lines.len().saturating_sub(1));
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            let candidate = cut(mid);
            if u64::from(self.counter.count_message(&candidate)) <= leftover {
                best = Some(candidate);
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        best.map(|message| (unit, message))
    }

    fn finish(self, plan: Plan, overhead: u64) -> Result<Trimmed, TrimError> {
        let options = self.options;
        let partial_unit = plan.partial.as_ref().map(|(unit, _)| *unit);
        let mut pieces = plan.kept;
        if let Some(unit) = partial_unit {
            let at = pieces.partition_point(|&kept| kept < unit);
            pieces.insert(at, unit);
        }
        let mut partial_message = plan.partial.map(|(_, message)| message);
        let mut marker = plan.marker;
        let mut marker_position = None;
        let mut out: Vec<Message> = Vec::new();
        let mut dropped = Vec::new();
        let mut next = 0;
        for unit in pieces {
            if let Some((at, omitted)) = marker
                && unit >= at
            {
                marker_position = Some(out.len());
                out.push(marker_message(omitted));
                marker = None;
            }
            let range = self.units[unit].messages();
            if range.start > next {
                dropped.push(next..range.start);
            }
            next = range.end;
            if Some(unit) == partial_unit
                && let Some(message) = partial_message.take()
            {
                out.push(message);
            } else {
                out.extend_from_slice(&self.messages[range]);
            }
        }
        if let Some((_, omitted)) = marker {
            marker_position = Some(out.len());
            out.push(marker_message(omitted));
        }
        if next < self.messages.len() {
            dropped.push(next..self.messages.len());
        }

        let mut repairs = Vec::new();
        if !validate_refs(&out, options.rules).is_empty() {
            let (repaired, changes) = repair(out, options.rules);
            let unrepaired: Vec<Violation> = changes
                .iter()
                .filter_map(|change| match change {
                    RepairChange::Unrepaired { violation } => Some(violation.clone()),
                    _ => None,
                })
                .collect();
            if !unrepaired.is_empty() {
                return Err(TrimError::Unrepairable {
                    rules: options.rules,
                    violations: unrepaired,
                });
            }
            out = repaired;
            repairs = changes;
            marker_position = marker_position.and_then(|_| {
                out.iter()
                    .position(|message| message.metadata.tags.iter().any(|tag| tag == MARKER_TAG))
            });
        }
        let tokens_after = out
            .iter()
            .map(|message| u64::from(self.counter.count_message(message)))
            .sum::<u64>()
            + overhead;
        if tokens_after > u64::from(options.max_tokens) {
            return Err(TrimError::OverBudget {
                tokens: tokens_after,
                max_tokens: options.max_tokens,
            });
        }
        // Count nothing more: the totals are what was counted while fitting.
        let tokens_before = self.costs.total().map(|total| total + overhead);
        let tokens_before_at_least = self.costs.counted() + overhead;
        Ok(Trimmed {
            messages: out,
            dropped,
            partial: partial_unit.map(|unit| self.units[unit].start),
            marker: marker_position,
            over_budget: plan.over,
            tokens_before,
            tokens_before_at_least,
            tokens_after,
            repairs,
        })
    }
}

/// The tag carried by the head+tail marker message.
pub const MARKER_TAG: &str = "contexture:omitted";

/// The head+tail marker: a user message "[k earlier messages omitted]", tagged
/// [`MARKER_TAG`].
pub fn marker_message(omitted: usize) -> Message {
    let text = if omitted == 1 {
        "[1 earlier message omitted]".to_owned()
    } else {
        format!("[{omitted} earlier messages omitted]")
    };
    let mut marker = Message::user(text);
    marker.metadata.tags.push(MARKER_TAG.to_owned());
    marker
}

/// The fixed units outside `head` and `tail` together with the units of both, ascending.
fn combine(fixed: &[usize], head: Range<usize>, tail: Range<usize>) -> Vec<usize> {
    let mut kept: Vec<usize> = fixed
        .iter()
        .copied()
        .filter(|unit| !head.contains(unit) && !tail.contains(unit))
        .collect();
    kept.extend(head);
    kept.extend(tail);
    kept.sort_unstable();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strategy_has_one_spelling_everywhere() {
        for (text, strategy) in [
            ("last", Strategy::Last),
            ("first", Strategy::First),
            ("head-tail", Strategy::HeadTail { head: 1 }),
            ("head-tail:3", Strategy::HeadTail { head: 3 }),
            ("head-tail:0", Strategy::HeadTail { head: 0 }),
        ] {
            assert_eq!(text.parse::<Strategy>(), Ok(strategy), "{text}");
            let json = serde_json::to_string(&strategy).unwrap();
            assert_eq!(serde_json::from_str::<Strategy>(&json).unwrap(), strategy);
        }
        assert_eq!(Strategy::HeadTail { head: 2 }.to_string(), "head-tail:2");
        assert_eq!(Strategy::default(), Strategy::Last);
        for (text, says) in [
            (
                "middle",
                "unknown strategy `middle` (expected last, first, head-tail or head-tail:N)",
            ),
            ("head_tail", "it is spelled `head-tail`"),
            ("head-tail:x", "N is the number of units kept at the start"),
            ("head-tail:-1", "N is the number of units kept at the start"),
            ("Last", "unknown strategy `Last`"),
        ] {
            let error = text.parse::<Strategy>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let error = serde_json::from_str::<Strategy>("\"middle\"").unwrap_err();
        assert!(
            error.to_string().contains("unknown strategy `middle`"),
            "{error}"
        );
    }
}
