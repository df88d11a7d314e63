//! The chat turn as one operation, whatever door it came through: a parsed turn request in,
//! a stored answer (a keyed turn sent again) or the upstream's response (whole or a stream,
//! recorded as it passes) out.
//!
//! [`ChatService::turn`] runs the whole turn: the fit settings for the call's model (built by
//! [`FitSettings::for_model`] from the service's registry and default policy, the stored
//! calibration and the request's overrides), the tenant's slot of chat turns in flight, the
//! claim on a keyed turn, the wait for the thread's turn, the answer of an earlier attempt,
//! then apart from the client's connection (a client that goes away changes nothing) the
//! engine's [`ChatTurn`] (new messages stored, compaction, fit, the request recorded), the
//! upstream call, and the recording of how it ended: at once for a whole answer, as the
//! stream passes for a streamed one (the stream ends only once its answer is stored, so a
//! client's next turn always finds it). A shutdown past its grace stops the turn and its
//! stream; what they leave is recorded as cut by the shutdown.
//!
//! A door parses its wire format into a [`TurnRequest`], calls [`ChatService::turn`], and
//! writes the [`TurnAnswer`] back in its own format.

use std::sync::Arc;
use std::time::Duration;

use contexture_core::compact::CompactionPolicy;
use contexture_core::fit::{FitPolicy, clear_thinking, clear_tool_results};
use contexture_core::message::Message;
use contexture_core::registry::Registry;
use contexture_core::thread::FitRecord;
use contexture_llm::Upstreams;
use contexture_llm::passthrough::{
    PassthroughError, UpstreamBody, UpstreamResponse, record_stream,
};
use contexture_llm::wire::{ChatCall, WireFormat};
use contexture_store::{Scoped, Store, StoreError, Tenant, TurnQueueStore};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::chat::{
    Attempt, ChatError, ChatTurn, CompletionRecord, StoredAnswer, TurnRecorder, continued_point,
    previous_attempt, turn_point,
};
use crate::compaction::{
    CompactRequest, CompactionError, CompactionOutcome, Compactor, compact_unstored,
};
use crate::cpu::CpuPool;
use crate::estimates::Learner;
use crate::fitting::{
    FitOverrides, FitSettings, FittedRequest, ModelChoice, ReplyReserveError, RequestEdits,
    SettingsError,
};
use crate::in_flight::InFlight;
use crate::keyed_turns::{KeyedTurns, TurnClaim};
use crate::tenant_slots::{Slot, SlotsFull, TenantSlots};
use crate::turns::{TurnLease, TurnQueue, TurnWaitError};

/// Why a turn got no answer.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The turn was refused (bad input, a fit that cannot be made, a key reused or in
    /// flight), or the store failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// The tenant has all its chat turns in flight already.
    #[error(transparent)]
    Busy(#[from] SlotsFull),
    /// The turns before it held the thread past the wait limit, or the store failed.
    #[error(transparent)]
    Wait(#[from] TurnWaitError),
    /// The process is shutting down.
    #[error("{}", crate::chat::SHUT_DOWN)]
    ShutDown,
    /// The fit settings cannot be made (an unknown model, a policy that does not work for
    /// it, the calibration unreadable).
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The upstream gave no response.
    #[error(transparent)]
    Upstream(#[from] PassthroughError),
    /// The task running the turn stopped.
    #[error("the turn stopped: {0}")]
    Stopped(String),
}

/// A chat turn, parsed from a door's wire format.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    /// The tenant it is for: the view of the store the turn runs on (see [`Scoped`]), its
    /// slots, its share of the CPU pool, its token calibration.
    pub tenant: Tenant,
    /// The thread, as the tenant names it.
    pub thread: String,
    /// What the request sets over the service's fit policy (a thread's own policy takes
    /// that one's place); the model is the call's.
    pub overrides: FitOverrides,
    /// The request's messages.
    pub messages: Vec<Message>,
    /// The call to make with the messages the turn chooses: its parameters as every
    /// upstream reads them (the tool schemas and structured-output schema are counted in
    /// the fit), and the client's request as it came.
    pub call: ChatCall,
    /// The reply budget the client asked for, with the field that gave it (an error names
    /// it).
    pub reply_budget: Option<(&'static str, u64)>,
    /// The choices the client asked for (`n`), when it said.
    pub choices: Option<u64>,
    /// Its idempotency key and the digest of what was sent with it, when it has one.
    pub key: Option<(String, String)>,
    /// The earlier request of the thread the turn continues from (the seq of its record):
    /// the turn sees the thread as it stood after that request's answer. When the thread
    /// has gone on past it, the turn runs on a new branch of the thread forked there
    /// (nothing copied). `None`: the thread's newest point.
    pub continues: Option<u64>,
    /// A system prompt of this call only: sent before the thread's own, not stored.
    pub instructions: Option<String>,
    /// False stores nothing of the turn: the thread (up to the point it continues from)
    /// with the request's messages is fitted and sent, and nothing is compacted or
    /// recorded.
    pub store: bool,
    /// Compact when the request passes this many tokens, whatever the policy's trigger (a
    /// turn that stores nothing: only with [`TurnRequest::compacts_request`]).
    pub compact_threshold: Option<u64>,
    /// True: a turn that stores nothing compacts the request's own messages past
    /// `compact_threshold` (nothing is stored), [`TurnPlace::summary`] holding what stands
    /// for the part it covered, for a client that sends it back in their place.
    pub compacts_request: bool,
    /// More instructions for the summary of that compaction.
    pub compact_instructions: Option<String>,
    /// True: a turn that stores nothing and compacts stops there, sending nothing upstream
    /// ([`TurnAnswer::Compacted`]).
    pub pause_after_compaction: bool,
    /// What the door keeps with the request's record to answer reads of it later
    /// ([`contexture_core::thread::RequestRecord::client`]).
    pub client_record: Option<serde_json::Value>,
}

impl TurnRequest {
    /// A turn of `tenant` on `thread` sending `messages` with `call`, stored, at the
    /// thread's newest point, with nothing else asked.
    pub fn new(tenant: Tenant, thread: String, messages: Vec<Message>, call: ChatCall) -> Self {
        TurnRequest {
            tenant,
            thread,
            overrides: FitOverrides::default(),
            messages,
            call,
            reply_budget: None,
            choices: None,
            key: None,
            continues: None,
            instructions: None,
            store: true,
            compact_threshold: None,
            compacts_request: false,
            compact_instructions: None,
            pause_after_compaction: false,
            client_record: None,
        }
    }
}

/// The tokens of a request ([`ChatService::count_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTokens {
    /// Its tokens, its edits made.
    pub tokens: u64,
    /// Its tokens before its edits, when it named any.
    pub before_edits: Option<u64>,
}

/// A turn's answer.
pub enum TurnAnswer {
    /// A keyed turn sent again: the answer its first attempt stored, in `thread`.
    Replayed {
        /// The answer.
        answer: Box<StoredAnswer>,
        /// The thread that holds it.
        thread: String,
    },
    /// The upstream's response, as it came (whole or a stream), its recording attached.
    Upstream {
        /// The response.
        response: UpstreamResponse,
        /// Where the turn was recorded.
        place: TurnPlace,
    },
    /// A turn that stores nothing compacted its request and, as asked
    /// ([`TurnRequest::pause_after_compaction`]), stopped there: nothing was sent upstream.
    Compacted {
        /// The compaction (in [`TurnPlace::summary`]).
        place: TurnPlace,
    },
}

/// Where a turn was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlace {
    /// The thread it ran on, as the tenant names it: the request's, or a branch of it.
    pub thread: String,
    /// The seq of its request's record (`None` when nothing was stored).
    pub request_seq: Option<u64>,
    /// When it ran on a new branch: the seq of the request's thread it was forked after.
    pub branched_after: Option<u64>,
    /// The messages a compaction of the turn put in the place of the history it covered.
    pub summary: Option<Vec<Message>>,
    /// For a turn that stores nothing and compacted: how many of the request's newest
    /// messages the compaction kept as they were, after the summary.
    pub summary_kept: usize,
    /// What fitting did to the request sent (what it left out, cleared, truncated).
    pub fit: Box<FitRecord>,
}

/// What a chat service tells its operator about each turn (metrics, logs).
pub trait ChatObserver: Send + Sync {
    /// The thread's compaction trigger fired: what compaction did, or why it failed (the
    /// turn was trimmed instead).
    fn compacted(&self, thread: &str, outcome: &Result<CompactionOutcome, CompactionError>);
    /// A request was fitted and is being sent.
    fn request_fitted(&self, fitted: &FittedRequest);
    /// How a call ended could not be recorded (its response went back regardless).
    fn recording_failed(&self, tenant: &str, error: &StoreError);
}

/// The limits of a chat service.
#[derive(Debug, Clone, Copy)]
pub struct ChatLimits {
    /// How long a turn waits for the turns before it on its thread.
    pub turn_wait: Duration,
    /// How old a keyed turn's unanswered attempt must be to be taken as abandoned.
    pub abandon_after_secs: f64,
}

/// What a chat service is made of.
pub struct ChatParts<S> {
    /// The store holding the threads.
    pub store: S,
    /// Where requests go, by model.
    pub upstreams: Upstreams,
    /// The models (window, tokenizer, rules) requests are fitted for.
    pub registry: Arc<Registry>,
    /// The default fit policy (a thread's own takes its place).
    pub fit_policy: FitPolicy,
    /// Who compacts.
    pub compactor: Arc<Compactor>,
    /// The default compaction policy (a thread's own takes its place).
    pub compaction: Option<CompactionPolicy>,
    /// Where fitting runs.
    pub cpu: Arc<CpuPool>,
    /// The queue of turns on each thread (the thread operations of the process queue
    /// there too).
    pub turns: Arc<TurnQueue>,
    /// The tenants' chat turns in flight.
    pub slots: Arc<TenantSlots>,
    /// Work the shutdown waits for.
    pub in_flight: Arc<InFlight>,
    /// Its limits.
    pub limits: ChatLimits,
    /// Who hears about each turn.
    pub observer: Arc<dyn ChatObserver>,
}

/// The chat turn operation (see the module documentation). Cheap to clone.
pub struct ChatService<S> {
    parts: Arc<ChatParts<S>>,
    keyed: Arc<KeyedTurns>,
}

impl<S> Clone for ChatService<S> {
    fn clone(&self) -> Self {
        ChatService {
            parts: self.parts.clone(),
            keyed: self.keyed.clone(),
        }
    }
}

/// This process's claim on a keyed turn, and what the turn records of its key.
struct Keyed {
    key: String,
    digest: String,
    first_attempt: bool,
    _claim: TurnClaim,
}

/// Records how a call ended, holding the tenant's slot and the keyed turn's claim until its
/// end is recorded.
struct Recorder<S> {
    turn: TurnRecorder<S>,
    tenant: String,
    observer: Arc<dyn ChatObserver>,
    _keyed: Option<Keyed>,
    _slot: Slot,
}

impl<S> Recorder<S> {
    fn logged(&self, recorded: Result<(), StoreError>) {
        if let Err(error) = recorded {
            self.observer.recording_failed(&self.tenant, &error);
        }
    }
}

impl<S: Store + TurnQueueStore + Clone + 'static> ChatService<S> {
    /// A chat service made of `parts`.
    pub fn new(parts: ChatParts<S>) -> ChatService<S> {
        ChatService {
            parts: Arc::new(parts),
            keyed: Arc::new(KeyedTurns::default()),
        }
    }

    /// One of `tenant`'s places among the chat turns in flight, for other work that calls
    /// the upstream for the tenant (a compaction through the API); held until dropped.
    pub fn take_slot(&self, tenant: &Tenant) -> Result<Slot, SlotsFull> {
        self.parts.slots.take(tenant.name())
    }

    /// The wire format of the upstream `model`'s calls go to, which its responses are in.
    pub fn upstream_format(&self, model: &str) -> WireFormat {
        self.parts.upstreams.for_model(model).format()
    }

    /// Where requests go, by model.
    pub fn upstreams(&self) -> &Upstreams {
        &self.parts.upstreams
    }

    /// Sends a request that keeps no thread within the tenant's slots: `call` with its
    /// messages, or, when the client spoke the upstream's own format, `body` as it came.
    pub async fn pass_through(
        &self,
        tenant: &Tenant,
        call: &ChatCall,
        messages: &[Message],
    ) -> Result<UpstreamResponse, TurnError> {
        let slot = self.parts.slots.take(tenant.name())?;
        let upstream = self.parts.upstreams.for_model(&call.model);
        let response = if call.client.format.is(upstream.format()) {
            upstream.forward(&call.client.body).await?
        } else {
            upstream.send(call, messages).await?
        };
        Ok(holding(response, slot))
    }

    /// The tokens a request of `tenant` for `model` sending `messages` with the tool
    /// schemas `tools` counts as when a turn fits it: each message, the reply's priming and
    /// the schemas, by the model's counter (exact where its tokenizer is known, else the
    /// estimate calibrated from the usage upstreams reported). With `edits`, the tokens
    /// once they are made (old reasoning left out, old tool results cleared, as a turn
    /// makes them before fitting), with the count before them.
    pub async fn count_request(
        &self,
        tenant: &Tenant,
        model: &str,
        messages: &[Message],
        tools: &[serde_json::Value],
        edits: Option<&RequestEdits>,
    ) -> Result<RequestTokens, TurnError> {
        let settings = FitSettings::for_model(
            Some(&self.parts.store),
            &self.parts.registry,
            ModelChoice::Named(model),
            &Learner::Tenant(tenant.clone()),
            self.parts.fit_policy.clone(),
            FitOverrides::default(),
        )
        .await?;
        let counter = &settings.model.counter;
        let tokens = counter.count_request_total(messages, tools);
        let Some(edits) = edits else {
            return Ok(RequestTokens {
                tokens,
                before_edits: None,
            });
        };
        let mut edited = messages.to_vec();
        if let Some(policy) = edits.clear_thinking {
            clear_thinking(&mut edited, policy, counter);
        }
        if let Some(clear) = &edits.clear_tool_results {
            let options = clear.options(counter.count_tools(tools));
            let cleared = clear_tool_results(&edited, &options, counter);
            // A clearing that frees less than the policy's least is not made.
            if clear
                .min_cleared
                .is_none_or(|least| cleared.tokens_cleared >= least)
            {
                edited = cleared.messages;
            }
        }
        Ok(RequestTokens {
            tokens: counter.count_request_total(&edited, tools),
            before_edits: Some(tokens),
        })
    }

    /// Runs a chat turn (see the module documentation).
    pub async fn turn(&self, request: TurnRequest) -> Result<TurnAnswer, TurnError> {
        check_one_choice(request.choices)?;
        let mut settings = FitSettings::for_model(
            // Calibrations are per model, the same through every tenant's view.
            Some(&self.parts.store),
            &self.parts.registry,
            ModelChoice::Named(&request.call.model),
            &Learner::Tenant(request.tenant.clone()),
            self.parts.fit_policy.clone(),
            request.overrides.clone(),
        )
        .await?;
        if let Some((field, tokens)) = request.reply_budget {
            settings
                .reserve_for_reply(tokens)
                .map_err(|error| ChatError::Invalid {
                    field,
                    message: match error {
                        ReplyReserveError::OutOfRange { .. } => format!("{field}: {error}"),
                        ReplyReserveError::Budget(error) => error.to_string(),
                    },
                })?;
        }
        // Held until the turn's end is recorded: a tenant's turns in flight are bounded,
        // so one tenant cannot hold every upstream connection and every waiting place.
        let slot = self.parts.slots.take(request.tenant.name())?;
        // The turn sees the tenant's threads only.
        let store = self.parts.store.clone().scoped(request.tenant.clone());
        // A retry of a keyed turn this process is answering is refused at once, not
        // queued behind itself.
        let claim = match &request.key {
            Some((key, _)) => Some(
                self.keyed
                    .claim(&store.global_id(&request.thread), key)
                    .ok_or_else(|| ChatError::InFlight {
                        key: key.to_owned(),
                    })?,
            ),
            None => None,
        };
        // Turns on one thread run one at a time, in the order they arrived; a turn that
        // waits too long is refused with nothing stored. Waiting writes nothing to the
        // thread, so a client that leaves meanwhile only gives up its place.
        if !request.store {
            if request.key.is_some() {
                return Err(ChatError::Invalid {
                    field: "Idempotency-Key",
                    message: "Idempotency-Key: a turn that stores nothing has nothing to answer a retry with; send it without a key, or store it".to_owned(),
                }
                .into());
            }
            return self.unrecorded_turn(store, request, settings, slot).await;
        }
        let mut request = request;
        let mut lease = self
            .parts
            .turns
            .wait_for_turn(&store, &request.thread, self.parts.limits.turn_wait)
            .await?;
        let mut branched_after = None;
        let keyed = match (&request.key, claim) {
            (Some((key, digest)), Some(claim)) => {
                // Holding the thread, so an attempt another server answered while this one
                // waited is found answered.
                let abandon_after = self.parts.limits.abandon_after_secs;
                let mut attempt = previous_attempt(
                    &store,
                    &request.thread,
                    key,
                    digest,
                    abandon_after,
                    now_ms(),
                )
                .await?;
                // A keyed turn continuing an earlier point runs where its first attempt ran:
                // on the thread when the key is found there, else on the branch its key
                // names.
                if matches!(attempt, Attempt::First)
                    && let Some(request_seq) = request.continues
                {
                    let placed = self
                        .place(&store, &request.thread, request_seq, lease, Some(key))
                        .await?;
                    (request.thread, lease, branched_after) = placed;
                    if branched_after.is_some() {
                        attempt = previous_attempt(
                            &store,
                            &request.thread,
                            key,
                            digest,
                            abandon_after,
                            now_ms(),
                        )
                        .await?;
                    }
                }
                let first_attempt = match attempt {
                    Attempt::Answered(answer) => {
                        return Ok(TurnAnswer::Replayed {
                            answer,
                            thread: request.thread,
                        });
                    }
                    Attempt::First => true,
                    Attempt::Again => false,
                };
                Some(Keyed {
                    key: key.clone(),
                    digest: digest.clone(),
                    first_attempt,
                    _claim: claim,
                })
            }
            _ => None,
        };
        if keyed.is_none()
            && let Some(request_seq) = request.continues
        {
            let placed = self
                .place(&store, &request.thread, request_seq, lease, None)
                .await?;
            (request.thread, lease, branched_after) = placed;
        }
        // The turn runs apart from the client's connection from here on: a client that
        // goes away does not cancel it halfway (its messages stored but never sent), nor
        // the call and its recording (the answer is stored, and a retry with the same key
        // gets it); a shutdown waits for it.
        let guard = self.parts.in_flight.enter();
        let service = self.clone();
        let turn = tokio::spawn(async move {
            let _guard = guard;
            service
                .run_turn(store, request, settings, keyed, lease, slot, branched_after)
                .await
        });
        turn.await
            .map_err(|error| TurnError::Stopped(error.to_string()))?
    }

    /// Where a turn continuing after the request recorded at `request_seq` in `thread`
    /// runs, holding `thread` with `lease`: on the thread when nothing followed that
    /// request's answer, else on a branch forked after it (named after the key of a keyed
    /// turn, so that its retries find it). Returns the thread, the lease held on it, and
    /// the fork point of a branch.
    async fn place(
        &self,
        store: &Scoped<S>,
        thread: &str,
        request_seq: u64,
        lease: TurnLease,
        key: Option<&str>,
    ) -> Result<(String, TurnLease, Option<u64>), TurnError> {
        let (point, went_on) = continued_point(store, thread, request_seq).await?;
        if !went_on {
            return Ok((thread.to_owned(), lease, None));
        }
        let branch = branch_name(thread, point, key);
        let exists = key.is_some() && store.exists(&branch).await.map_err(ChatError::Store)?;
        if !exists {
            store
                .fork(thread, point, &branch)
                .await
                .map_err(ChatError::Store)?;
        }
        // The branch is new (or the key's own): its turn does not wait on the thread.
        drop(lease);
        let lease = self
            .parts
            .turns
            .wait_for_turn(store, &branch, self.parts.limits.turn_wait)
            .await?;
        Ok((branch, lease, Some(point)))
    }

    /// A turn that stores nothing: fitted, sent, not recorded.
    async fn unrecorded_turn(
        &self,
        store: Scoped<S>,
        request: TurnRequest,
        settings: FitSettings,
        slot: Slot,
    ) -> Result<TurnAnswer, TurnError> {
        let through = match request.continues {
            Some(request_seq) => Some(turn_point(&store, &request.thread, request_seq).await?),
            None => None,
        };
        let (messages, summary, summary_kept) = match request.compact_threshold {
            Some(threshold) if request.compacts_request => {
                self.compacted_request(&request, &settings, threshold)
                    .await?
            }
            _ => (request.messages.clone(), None, 0),
        };
        if request.pause_after_compaction && summary.is_some() {
            return Ok(TurnAnswer::Compacted {
                place: TurnPlace {
                    thread: request.thread,
                    request_seq: None,
                    branched_after: None,
                    summary,
                    summary_kept,
                    fit: Box::default(),
                },
            });
        }
        let turn = ChatTurn {
            store: &store,
            thread: &request.thread,
            settings,
            tools: &request.call.tools,
            response_format: request.call.response_format.as_ref(),
            compaction: None,
            compactor: &self.parts.compactor,
            key: None,
            first_attempt: false,
            client_digest: None,
            learner: Learner::Tenant(request.tenant.clone()),
            cpu: Some((&self.parts.cpu, request.tenant.name().to_owned())),
            instructions: request.instructions.as_deref(),
            compact_threshold: None,
            compact_instructions: None,
            client_record: None,
            sends_reasoning: true,
        };
        let fitted = turn.fit_unrecorded(messages, through).await?;
        self.parts.observer.request_fitted(&fitted);
        let response = self
            .parts
            .upstreams
            .for_model(&request.call.model)
            .send(&request.call, &fitted.messages)
            .await?;
        Ok(TurnAnswer::Upstream {
            response: holding(response, slot),
            place: TurnPlace {
                thread: request.thread,
                request_seq: None,
                branched_after: None,
                summary,
                summary_kept,
                fit: Box::new(fitted.fit),
            },
        })
    }

    /// The messages of `request`, a turn that stores nothing, compacted when they pass
    /// `threshold` tokens for the model `settings` fit for: its system prompt, what stands
    /// for the part the compaction covered, and the newest messages it kept (how many is
    /// the third value). The server's compaction policy (or the default) chooses what stays
    /// and who summarizes; at most half the threshold stays verbatim. A compaction that
    /// fails leaves the messages as they were (the operator is told, the turn goes on).
    async fn compacted_request(
        &self,
        request: &TurnRequest,
        settings: &FitSettings,
        threshold: u64,
    ) -> Result<(Vec<Message>, Option<Vec<Message>>, usize), TurnError> {
        let messages = request.messages.clone();
        let tokens = settings
            .model
            .counter
            .count_request_total(&messages, &request.call.tools);
        if tokens <= threshold {
            return Ok((messages, None, 0));
        }
        let (system, history): (Vec<Message>, Vec<Message>) = messages
            .iter()
            .cloned()
            .partition(|message| message.role.is_system_like());
        let mut policy = self.parts.compaction.clone().unwrap_or_default();
        policy.trigger = contexture_core::compact::Trigger {
            tokens: Some(threshold),
            ..Default::default()
        };
        let half = threshold / 2;
        policy.keep.tokens = Some(policy.keep.tokens.map_or(half, |kept| kept.min(half)));
        if let Some(instructions) = &request.compact_instructions {
            let template = policy
                .prompt
                .as_deref()
                .unwrap_or(contexture_core::compact::DEFAULT_PROMPT);
            policy.prompt = Some(contexture_core::compact::with_instructions(
                template,
                instructions,
            ));
        }
        let mut compact = CompactRequest::new(
            policy,
            format!("the request's {tokens} tokens passed {threshold}"),
        );
        compact.measure_model = request.call.model.clone();
        let (view, outcome) = match compact_unstored(&self.parts.compactor, history, &compact).await
        {
            Ok((view, report)) => (Some(view), Ok(report.outcome)),
            Err(error) => (None, Err(error)),
        };
        self.parts.observer.compacted(&request.thread, &outcome);
        match (view, outcome) {
            (Some(view), Ok(CompactionOutcome::Compacted { .. })) => {
                let summary = view.replacement().to_vec();
                let kept = view.messages().len() - summary.len();
                let mut sent = system;
                sent.extend_from_slice(view.messages());
                Ok((sent, Some(summary), kept))
            }
            _ => Ok((messages, None, 0)),
        }
    }

    /// The turn once it holds its thread: prepared, sent, and its end recorded.
    #[allow(clippy::too_many_arguments)]
    async fn run_turn(
        self,
        store: Scoped<S>,
        request: TurnRequest,
        settings: FitSettings,
        keyed: Option<Keyed>,
        lease: TurnLease,
        slot: Slot,
        branched_after: Option<u64>,
    ) -> Result<TurnAnswer, TurnError> {
        let parts = &self.parts;
        let TurnRequest {
            tenant,
            thread,
            messages,
            call,
            instructions,
            compact_threshold,
            compact_instructions,
            client_record,
            ..
        } = request;
        let turn = ChatTurn {
            store: &store,
            thread: &thread,
            settings,
            tools: &call.tools,
            response_format: call.response_format.as_ref(),
            compaction: parts.compaction.as_ref(),
            compactor: &parts.compactor,
            key: keyed.as_ref().map(|keyed| keyed.key.as_str()),
            first_attempt: keyed.as_ref().is_some_and(|keyed| keyed.first_attempt),
            client_digest: keyed.as_ref().map(|keyed| keyed.digest.clone()),
            learner: Learner::Tenant(tenant.clone()),
            cpu: Some((&parts.cpu, tenant.name().to_owned())),
            instructions: instructions.as_deref(),
            compact_threshold,
            compact_instructions: compact_instructions.as_deref(),
            client_record: client_record.as_ref(),
            sends_reasoning: call.sends_reasoning_to(self.upstream_format(&call.model)),
        };
        let request_id = format!(
            "{thread}/chat-{}",
            crate::system::new_id(&crate::system::RandomIds::default())
        );
        // A shutdown past its grace stops the turn here too (a compaction's calls
        // included); what it left in flight is ended by the thread's next turn.
        let prepared = tokio::select! {
            prepared = turn.prepare(messages, request_id, lease) => prepared?,
            () = parts.in_flight.stopped() => return Err(TurnError::ShutDown),
        };
        if let Some(outcome) = &prepared.compaction {
            // The operator's logs name the thread in the whole store.
            parts.observer.compacted(&store.global_id(&thread), outcome);
        }
        parts.observer.request_fitted(&prepared.fitted);
        let recorder = Recorder {
            turn: turn.recorder(&prepared),
            tenant: tenant.name().to_owned(),
            observer: parts.observer.clone(),
            _keyed: keyed,
            _slot: slot,
        };
        let place = TurnPlace {
            thread: thread.clone(),
            request_seq: Some(prepared.request_seq),
            branched_after,
            summary: prepared.summary.clone(),
            summary_kept: 0,
            fit: Box::new(prepared.fitted.fit.clone()),
        };
        self.send_and_record(&call, &prepared.fitted.messages, recorder)
            .await
            .map(|response| TurnAnswer::Upstream { response, place })
    }

    /// Sends a fitted request and records how it ended (for a stream, once it has been
    /// passed through).
    async fn send_and_record(
        &self,
        call: &ChatCall,
        messages: &[Message],
        recorder: Recorder<Scoped<S>>,
    ) -> Result<UpstreamResponse, TurnError> {
        let in_flight = &self.parts.in_flight;
        let forwarded = tokio::select! {
            forwarded = self.parts.upstreams.for_model(&call.model).send(call, messages) => forwarded,
            () = in_flight.stopped() => {
                recorder.logged(recorder.turn.stopped().await);
                return Err(TurnError::ShutDown);
            }
        };
        let response = match forwarded {
            Ok(response) => response,
            Err(error) => {
                recorder.logged(recorder.turn.failed(error.to_string()).await);
                return Err(error.into());
            }
        };
        let ok = response.is_success();
        Ok(match response.body {
            UpstreamBody::Full(bytes) => {
                if ok {
                    let record = recorder
                        .turn
                        .completion(response.format, &bytes)
                        .await
                        .map_err(ChatError::Store)?;
                    if let CompletionRecord::Unreadable { recorded } = record {
                        recorder.logged(recorded);
                    }
                } else {
                    let error = format!("upstream answered {}", response.status);
                    recorder.logged(recorder.turn.failed(error).await);
                }
                UpstreamResponse {
                    body: UpstreamBody::Full(bytes),
                    ..response
                }
            }
            UpstreamBody::Stream(stream) if ok => {
                let guard = in_flight.enter();
                // The response ends only once the answer is stored, so a client's next turn
                // always finds it in the thread.
                let (stored_tx, stored_rx) = tokio::sync::oneshot::channel::<()>();
                // A shutdown that stops waiting cuts the stream; its recording says so.
                let stopped = in_flight.clone();
                let stream = stream.take_until(async move { stopped.stopped().await });
                let stopping = in_flight.clone();
                let stream = record_stream(Box::pin(stream), response.format, move |outcome| {
                    tokio::spawn(async move {
                        let _guard = guard;
                        let _stored = stored_tx;
                        let recorded = recorder
                            .turn
                            .stream_ended(outcome, stopping.is_stopping())
                            .await;
                        recorder.logged(recorded);
                    });
                });
                let stored = futures_util::stream::once(async move {
                    // Resolves when the recording task ends (its sender is dropped).
                    let _ = stored_rx.await;
                })
                .filter_map(|()| async { None });
                UpstreamResponse {
                    body: UpstreamBody::Stream(Box::pin(stream.chain(stored))),
                    ..response
                }
            }
            UpstreamBody::Stream(stream) => {
                let error = format!("upstream answered {}", response.status);
                recorder.logged(recorder.turn.failed(error).await);
                UpstreamResponse {
                    body: UpstreamBody::Stream(stream),
                    ..response
                }
            }
        })
    }
}

/// The name of a new branch of `thread` forked after `point`: the thread's root name and a
/// part of its own, made from the key of a keyed turn (the same for its retries), else new.
fn branch_name(thread: &str, point: u64, key: Option<&str>) -> String {
    let root = thread.split('~').next().unwrap_or(thread);
    let own = match key {
        Some(key) => {
            let mut digest = Sha256::new();
            digest.update(thread.as_bytes());
            digest.update(point.to_be_bytes());
            digest.update(key.as_bytes());
            let hash = digest.finalize();
            hash[..8].iter().map(|byte| format!("{byte:02x}")).collect()
        }
        None => crate::system::new_id(&crate::system::RandomIds::default()),
    };
    format!("{root}~{own}")
}

/// A thread keeps one answer per turn, so a request for several choices is refused rather
/// than keeping one of them silently (a client that went on with another would find a
/// history it never saw).
fn check_one_choice(choices: Option<u64>) -> Result<(), ChatError> {
    match choices {
        None | Some(1) => Ok(()),
        Some(n) => Err(ChatError::Invalid {
            field: "n",
            message: format!(
                "n: a thread keeps one answer per turn, so only n = 1 is accepted with a thread (not {n}); ask for several choices without a thread"
            ),
        }),
    }
}

/// `response` holding `slot` until its body has been sent (or dropped).
fn holding(response: UpstreamResponse, slot: Slot) -> UpstreamResponse {
    match response.body {
        UpstreamBody::Stream(stream) => UpstreamResponse {
            body: UpstreamBody::Stream(Box::pin(stream.map(move |chunk| {
                let _held = &slot;
                chunk
            }))),
            ..response
        },
        body @ UpstreamBody::Full(_) => UpstreamResponse { body, ..response },
    }
}

/// This machine's clock, in milliseconds since the Unix epoch (as the stores record).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}
