//! The end of a step: its output applied to the context store under the transition flags
//!, its exchange added to the shared history, the next state chosen,
//! and the items of an iteration selected. All of it becomes the events of one
//! transaction, so a step is recorded entirely or not at all.

use contexture_core::Message;
use contexture_core::context::flags::diff;
use std::collections::BTreeMap;

use contexture_core::context::{
    ClearContextStore, ContextStore, IterError, MergePolicy, ParsedOutput, RenderIsolation, Scope,
    StoreChange as FlagChange, TransitionFlags, apply_transition, parse_output, select_items,
};
use contexture_core::thread::{ContextReplace, EventKind, StepEnd, StoreChange};
use serde_json::Value;

use super::error::StepError;
use super::log::ItemResult;
use crate::workflow::{END, Next, State};

/// Where a step's events go and what they are based on.
pub(crate) struct Finishing<'a> {
    /// The execution.
    pub execution_id: &'a str,
    /// The step's number.
    pub step: u64,
    /// The state that ran.
    pub state: &'a State,
    /// The item's position, for the last item of an iteration.
    pub item: Option<usize>,
    /// The step's own output (for an iteration's last item, that item's output).
    pub output: &'a str,
    /// The context store before the step.
    pub store: &'a ContextStore,
    /// The shared history's messages before the step (a clear keeps their pinned ones).
    pub history: &'a [Message],
    /// The log's last seq before the step's events.
    pub last_seq: u64,
    /// The named context the step ran in: a clear applies to it.
    pub context: &'a str,
    /// Where the transition's expressions run, for a workflow a client sent.
    pub isolation: Option<&'a dyn RenderIsolation>,
}

/// The events that finish a step whose exchanges are `exchanges`: one for a plain step
/// (`merge` is `None`); every item's, in order, for an iteration's last item or an empty
/// iteration, brought together by `merge`.
pub(crate) fn finish(
    at: &Finishing<'_>,
    exchanges: &[ItemResult],
    merge: Option<MergePolicy>,
) -> Result<Vec<EventKind>, StepError> {
    let iterated = merge.is_some();
    let flags = at.state.next.as_ref().map(Next::flags).unwrap_or_default();
    let parsed: Vec<ParsedOutput> = exchanges
        .iter()
        .map(|exchange| parse_output(&exchange.output))
        .collect();
    let store = fold_outputs(&flags, at.store, &parsed, merge.unwrap_or_default())?;
    let output = if iterated {
        Value::Array(parsed.iter().map(|p| p.value.clone()).collect())
    } else {
        parsed
            .first()
            .map_or(Value::Null, |parsed| parsed.value.clone())
    };
    let target = choose(
        at.state.next.as_ref(),
        Scope::new(&store)
            .with_output(&output)
            .isolated_by(at.isolation),
    )?;
    let items = match at.state.next.as_ref().and_then(|n| n.iter_key.as_deref()) {
        Some(key) if target != END => Some(select_items(key, &store, Some(&output))?),
        _ => None,
    };

    let mut events = Vec::new();
    if flags.clear_prior_messages {
        events.push(EventKind::ContextReplaced(
            ContextReplace::clear(
                format!("{}/step-{}/clear", at.execution_id, at.step),
                at.last_seq,
                at.history,
            )
            .in_context(at.context),
        ));
    }
    if flags.output_in_history() {
        for exchange in exchanges {
            match &at.state.workflow {
                // A sub-workflow's result joins the history only as one summary message,
                // when asked for.
                Some(reference) => {
                    if at.state.history_summary {
                        let child = exchange.child_execution_id.as_deref().unwrap_or("?");
                        events.push(message(
                            Message::assistant(format!(
                                "Sub-workflow `{reference}` (execution {child}) returned: {}",
                                exchange.output
                            )),
                            &at.state.id,
                        ));
                    }
                }
                None => {
                    if let Some(task) = &exchange.task {
                        events.push(message(Message::user(task.clone()), &at.state.id));
                    }
                    events.push(message(
                        Message::assistant(exchange.output.clone()),
                        &at.state.id,
                    ));
                }
            }
        }
    }
    events.extend(store_events(&flags, at.store, &store));
    events.push(EventKind::StepFinished(StepEnd {
        step: at.step,
        state_id: at.state.id.clone(),
        item: at.item,
        output: at.output.to_owned(),
        merge: items
            .as_ref()
            .and(at.state.next.as_ref().and_then(|next| next.iter_merge)),
        item_keys: items.as_ref().and(
            at.state
                .next
                .as_ref()
                .and_then(|next| next.include_in_iterator_context.clone()),
        ),
        item_concurrency: items.as_ref().and(
            at.state
                .next
                .as_ref()
                .and_then(|next| next.max_concurrency)
                .filter(|concurrency| *concurrency > 1),
        ),
        next: Some(target),
        items,
    }));
    Ok(events)
}

/// Applies each output in turn to the store under the flags: for an iteration, the items'
/// outputs in item order, as if each item had been a step of its own, brought together by
/// `merge` (`append` collects each key's values in a list; `error` refuses two different
/// values for one key).
fn fold_outputs(
    flags: &TransitionFlags,
    store: &ContextStore,
    parsed: &[ParsedOutput],
    merge: MergePolicy,
) -> Result<ContextStore, StepError> {
    let flags = TransitionFlags {
        append_to_context: flags.append_to_context || merge == MergePolicy::Append,
        ..flags.clone()
    };
    let mut current = store.clone();
    let mut contributed: BTreeMap<String, (usize, Value)> = BTreeMap::new();
    for (index, output) in parsed.iter().enumerate() {
        if merge == MergePolicy::Error {
            for (key, value) in contributions(&flags, output) {
                match contributed.get(&key) {
                    Some((first, earlier)) if *earlier != value => {
                        return Err(IterError::Conflict {
                            key,
                            first: *first,
                            second: index,
                        }
                        .into());
                    }
                    Some(_) => {}
                    None => {
                        contributed.insert(key, (index, value));
                    }
                }
            }
        }
        current = apply_transition(&flags, &current, output).store;
    }
    // An iteration of no items still applies the clearing flags.
    if parsed.is_empty() {
        current = apply_transition(
            &TransitionFlags {
                store_in_context: false,
                ..flags
            },
            &current,
            &parse_output(""),
        )
        .store;
    }
    Ok(current)
}

/// The (key, value) pairs an output puts in the store under `flags`.
fn contributions(flags: &TransitionFlags, output: &ParsedOutput) -> Vec<(String, Value)> {
    if !flags.store_in_context || flags.clear_context_store == ClearContextStore::All {
        return Vec::new();
    }
    match &flags.output_key {
        Some(key) if output.is_structured() => vec![(key.clone(), output.value.clone())],
        Some(key) => vec![(key.clone(), Value::String(output.raw.clone()))],
        None => output.contributions(),
    }
}

/// The store events that turn `before` into `after`. A transition that clears the store is
/// recorded as a clear followed by the new keys, so replaying it gives the same key order.
fn store_events(
    flags: &TransitionFlags,
    before: &ContextStore,
    after: &ContextStore,
) -> Vec<EventKind> {
    if flags.clear_context_store != ClearContextStore::No && !before.is_empty() {
        let mut events = vec![EventKind::StoreChanged(StoreChange::Cleared)];
        events.extend(after.as_map().iter().map(|(key, value)| {
            EventKind::StoreChanged(StoreChange::Set {
                key: key.clone(),
                value: value.clone(),
            })
        }));
        return events;
    }
    diff(before, after)
        .into_iter()
        .map(|change| {
            EventKind::StoreChanged(match change {
                FlagChange::Set { key, new, .. } => StoreChange::Set { key, value: new },
                FlagChange::Remove { key, .. } => StoreChange::Unset { key },
            })
        })
        .collect()
}

/// The state a transition leads to (`end` included), given the store after the step and
/// the step's output.
fn choose(next: Option<&Next>, scope: Scope<'_>) -> Result<String, StepError> {
    let Some(next) = next else {
        return Ok(END.to_owned());
    };
    if next.end {
        return Ok(END.to_owned());
    }
    if let Some(id) = &next.state_id {
        return Ok(id.clone());
    }
    if let Some(branch) = &next.condition {
        return Ok(branch.choose(scope)?.clone());
    }
    if let Some(switch) = &next.switch {
        return switch
            .choose(scope)?
            .cloned()
            .ok_or(StepError::NoCaseMatched);
    }
    Ok(END.to_owned())
}

fn message(mut message: Message, state_id: &str) -> EventKind {
    message.metadata.origin_step = Some(state_id.to_owned());
    EventKind::MessageAppended { message }
}
