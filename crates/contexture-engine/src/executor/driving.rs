//! Driving a run: its steps one after another within its time limit, each event recorded
//! and folded, what other writers appended absorbed, and a cancellation noticed and ended.

use std::time::Duration;

use contexture_core::thread::{CancelRequest, Event, EventKind, RunEnd, RunStatus};
use contexture_store::{NewEvent, Store};

use crate::conversation;

use super::{
    ExecError, Executor, Position, Run, RunOutcome, cancel_text, cancelled_results, items, outcome,
    step,
};

impl<S: Store> Executor<S> {
    /// Drives the run to its end, then closes the MCP servers it started, however it ended.
    pub(super) async fn drive_and_close(&self, run: &mut Run) -> Result<RunOutcome, ExecError> {
        let outcome = self.drive_within_time(run).await;
        run.mcp.close().await;
        outcome
    }

    /// [`Executor::drive`] under the run's wall-clock limit: when it passes, the run is
    /// cancelled through the store like any cancellation, so its steps end the way a
    /// cancel ends them (open tool calls answered, `run_ended` recorded).
    pub(super) async fn drive_within_time(&self, run: &mut Run) -> Result<RunOutcome, ExecError> {
        let Some(seconds) = run.limits.max_seconds else {
            return self.drive(run).await;
        };
        let id = run.id.clone();
        let deadline = tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0)));
        let drive = self.drive(run);
        tokio::pin!(deadline, drive);
        tokio::select! {
            outcome = &mut drive => return outcome,
            () = &mut deadline => {}
        }
        self.cancel(
            &id,
            Some(format!(
                "wall-clock limit reached: the run may take {seconds} s"
            )),
        )
        .await?;
        drive.await
    }

    /// Runs steps until the workflow ends or a step fails.
    pub(super) async fn drive(&self, run: &mut Run) -> Result<RunOutcome, ExecError> {
        loop {
            self.refresh(run).await?;
            if let Some(request) = run.log.cancel_requested().cloned() {
                return Err(self.end_cancelled(run, &request).await);
            }
            match run.log.position().clone() {
                Position::Start => {
                    let first = run.workflow.states[0].id.clone();
                    self.run_state(run, first, step::Work::Plain).await?;
                }
                Position::State(id) => self.run_state(run, id, step::Work::Plain).await?,
                Position::Iteration(iteration) => {
                    let state = iteration.state_id.clone();
                    let workflow = run.workflow.clone();
                    let at_once = iteration.concurrency > 1
                        && iteration.items.len() > iteration.done.len() + 1
                        && workflow
                            .state(&state)
                            .is_some_and(|s| !items::one_at_a_time(run, &workflow, s));
                    if at_once {
                        self.run_items_at_once(run, iteration).await?;
                    } else {
                        self.run_state(run, state, step::Work::item(iteration))
                            .await?;
                    }
                }
                Position::End => {
                    let output = run.log.last_output().unwrap_or_default().to_owned();
                    if let Some(thread) = run.log.start().and_then(|s| s.conversation.clone()) {
                        let input = run.log.start().map(|s| s.input.clone()).unwrap_or_default();
                        self.store
                            .append(&thread, conversation::turns(&run.id, &input, &output))
                            .await?;
                    }
                    self.append(
                        run,
                        vec![EventKind::RunEnded(RunEnd {
                            status: RunStatus::Completed,
                            output: Some(output),
                            error: None,
                        })],
                    )
                    .await?;
                    return Ok(outcome(&run.id, &run.log));
                }
            }
        }
    }

    /// Appends `events` to the run's log in one transaction and folds them in.
    pub(crate) async fn append(
        &self,
        run: &mut Run,
        events: Vec<EventKind>,
    ) -> Result<(), ExecError> {
        if run.staging.is_some() {
            return events.into_iter().try_for_each(|kind| run.hold(kind));
        }
        let seqs = self
            .store
            .append(&run.id, events.iter().cloned().map(NewEvent::new).collect())
            .await?;
        self.absorb(run, &seqs, events).await
    }

    /// Folds events the store acknowledged at `seqs`. When another writer appended in
    /// between (the seqs do not follow the fold), the fold catches up from the store.
    pub(super) async fn absorb(
        &self,
        run: &mut Run,
        seqs: &[u64],
        events: Vec<EventKind>,
    ) -> Result<(), ExecError> {
        let expected = run.log.thread().last_seq() + 1;
        let in_order = seqs
            .iter()
            .enumerate()
            .all(|(n, seq)| *seq == expected + n as u64);
        let fold = |run: &mut Run, event: Event| {
            if let Some(observer) = &self.observer {
                observer.on_event(&run.id, &event);
            }
            run.log.apply(event).map_err(|source| ExecError::Log {
                execution_id: run.id.clone(),
                source,
            })
        };
        if in_order {
            for (seq, kind) in seqs.iter().zip(events) {
                fold(run, Event::new(*seq, kind))?;
            }
        } else {
            let last = run.log.thread().last_seq();
            for event in self.store.events(&run.id).await? {
                if event.seq > last {
                    fold(run, event)?;
                }
            }
        }
        Ok(())
    }

    /// Folds in what other writers appended to the run's log (a cancellation, say).
    pub(crate) async fn refresh(&self, run: &mut Run) -> Result<(), ExecError> {
        if run.staging.is_some() {
            // An item's copy holds events the store has not seen, so it takes in only what
            // concerns it from other writers: a cancellation.
            for event in self.store.events_after(&run.id, run.store_seq()).await? {
                if let Some(staging) = &mut run.staging {
                    staging.store_seq = event.seq;
                }
                if let EventKind::CancelRequested(_) = event.kind {
                    run.see(event.kind)?;
                }
            }
            return Ok(());
        }
        let last = run.log.thread().last_seq();
        for event in self.store.events_after(&run.id, last).await? {
            if let Some(observer) = &self.observer {
                observer.on_event(&run.id, &event);
            }
            run.log.apply(event).map_err(|source| ExecError::Log {
                execution_id: run.id.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Resolves when a cancellation of `execution_id` is recorded after `after` (polling
    /// the store); never resolves otherwise.
    pub(crate) async fn cancellation(&self, execution_id: &str, mut after: u64) -> CancelRequest {
        loop {
            tokio::time::sleep(self.cancel_poll).await;
            // A store error here is not the call's business: the next poll tries again.
            if let Ok(events) = self.store.events_after(execution_id, after).await {
                for event in events {
                    after = event.seq;
                    if let EventKind::CancelRequested(request) = event.kind {
                        return request;
                    }
                }
            }
        }
    }

    /// Ends a run between steps as cancelled: calls left unanswered in the shared history
    /// get a synthetic result, then the run's end is recorded.
    pub(super) async fn end_cancelled(&self, run: &mut Run, request: &CancelRequest) -> ExecError {
        let reason = cancel_text(request.reason.as_deref());
        let mut events = cancelled_results(&run.log.thread().projection().messages)
            .into_iter()
            .map(|message| EventKind::MessageAppended { message })
            .collect::<Vec<_>>();
        events.push(EventKind::RunEnded(RunEnd {
            status: RunStatus::Cancelled,
            output: None,
            error: Some(reason.clone()),
        }));
        if let Err(error) = self.append(run, events).await {
            return error;
        }
        ExecError::Cancelled {
            execution_id: run.id.clone(),
            reason: request.reason.clone(),
        }
    }
}
