//! An assistant step: LLM calls fitted to the model's window, the hooks around each call,
//! the execution's token and cost budgets, and the tool-call loop. The step's tool calls and
//! results are `step_message` events of its own log; only its final answer is returned to
//! enter the shared history.

use contexture_core::fit::CutMemory;
use contexture_core::registry::ModelInfo;
use contexture_core::thread::{
    CancelRequest, ContextReplace, EventKind, PrefixReuse, RecordedBudget, ReplaceReason,
    RequestEnd, RequestOutcome, RequestRecord, RunLimits, StepMessage, Usage,
};
use contexture_core::{Message, ToolCall, budget::BudgetBreakdown};
use contexture_llm::{ChatRequest, ChatResponse, LlmError};
use contexture_store::Store;
use serde_json::Value;

use super::error::{ExecError, StepError};
use super::item_budget::Decision;
use super::request::check_view;
use super::step::{Abort, StepContext};
use super::tree_budget::Spent;
use super::{Executor, McpProgress, Run, cancel_text, cancelled_results, unanswered_calls};
use crate::calls::request_end;
use crate::compaction::LoopView;
use crate::fitting::{
    FitError, FitOverrides, FitSettings, FitTarget, FittedRequest, ModelChoice, SettingsError,
    fit_request_in_loop,
};
use crate::hooks::{BeforeCall, CallInfo, HistoryChange, HookError, HookFailed, HookPoint};
use crate::llm::Route;
use crate::mcp::OfferedTool;
use crate::tools::{
    configured_arguments, is_context_manager, merge_arguments, parse_model_arguments, schema,
};
use crate::workflow::Assistant;

/// An assistant step's setup, resolved once when the step starts: every call and tool call
/// of the step goes to the same route with the same tools and system prompt.
pub(crate) struct AssistantSetup<'a> {
    /// The step it runs in.
    pub step: &'a StepContext<'a>,
    /// The assistant.
    pub assistant: &'a Assistant,
    /// Where its calls go.
    pub route: Route,
    /// The model called, as the registry knows it (window, pricing, tokenizer).
    pub model: ModelInfo,
    /// The schemas of its tools, sent with every call (its MCP servers' included).
    pub tools: Vec<Value>,
    /// The tools of its MCP servers, by the names the model calls them.
    pub mcp_tools: Vec<OfferedTool>,
    /// Its rendered system prompt; without one, the shared history's.
    pub system: Option<Message>,
}

/// A request after the hooks: the messages to send and their breakdown.
struct Outgoing {
    messages: Vec<Message>,
    breakdown: BudgetBreakdown,
    prepared: FittedRequest,
    /// The most tokens the reply may take: the reserve, or less when the run's token or
    /// cost budget leaves less.
    reply_tokens: u32,
}

impl<S: Store> Executor<S> {
    /// Runs an assistant step and returns its final answer.
    pub(crate) async fn run_assistant(
        &self,
        run: &mut Run,
        step: &StepContext<'_>,
        assistant: &Assistant,
        task: Option<&str>,
    ) -> Result<String, Abort> {
        let info = &step.info;
        let route = self.router.route(&assistant.model);
        // Fitted as every request is: the route's model, calibrated, under the assistant's
        // policy (whose window replaces the registry's), the route's rules when it names them.
        let settings = FitSettings::for_model(
            Some(&self.store),
            &self.registry,
            ModelChoice::Routed(&route.model),
            &self.learner,
            assistant.fit.clone(),
            FitOverrides {
                rules: route.rules,
                ..FitOverrides::default()
            },
        )
        .await
        .map_err(|error| -> Abort {
            match error {
                SettingsError::Store(error) => ExecError::from(error).into(),
                SettingsError::Budget(error) => StepError::from(FitError::Budget(error)).into(),
                SettingsError::Model(error) => StepError::from(error).into(),
            }
        })?;
        let policy = settings.budget();
        let mut tools: Vec<Value> = assistant
            .tools
            .iter()
            .filter_map(|id| step.workflow.tool(id))
            .map(schema)
            .collect();
        let mcp_tools = self.mcp_tools(run, step, assistant).await?;
        tools.extend(mcp_tools.iter().map(|offered| offered.schema.clone()));
        let system = match &assistant.system_prompt {
            Some(prompt) => Some(Message::system(
                prompt
                    .render(&step.store, &step.options)
                    .map_err(|error| StepError::Template {
                        place: format!("the system prompt of assistant `{}`", assistant.id),
                        error,
                    })?
                    .text,
            )),
            None => None,
        };
        let setup = AssistantSetup {
            step,
            assistant,
            route,
            model: settings.model.clone(),
            tools,
            mcp_tools,
            system,
        };
        let target = settings.target(&policy, &setup.tools);
        if run.limits.max_cost_usd.is_some() && setup.model.pricing.is_none() {
            return Err(StepError::NoPrice {
                model: setup.model.id.clone(),
            }
            .into());
        }
        let task: Vec<Message> = task
            .map(|task| {
                let mut message = Message::user(task);
                message.metadata.origin_step = Some(info.state_id.clone());
                vec![message]
            })
            .unwrap_or_default();
        // The step's own messages (its task, then its tool loop) as its requests send them:
        // a compaction of the loop stands for its oldest ones; the log keeps them all.
        let mut own = LoopView::new(task);
        // What the loop's calls cut, cut again by the next (their prefix then stays the same),
        // and what the previous call sent.
        let mut memory = CutMemory::default();
        let mut previous: Option<Vec<Message>> = None;
        let first_round = self.carry_on(run, &setup, &mut own).await?;
        for round in first_round..assistant.max_iterations {
            self.refresh(run).await?;
            if let Some(request) = run.log.cancel_requested().cloned() {
                return Err(self.cancel_step(run, info.step, own.own(), request).await);
            }
            let call = CallInfo {
                step: info.clone(),
                assistant_id: assistant.id.clone(),
                model: setup.route.model.clone(),
                round,
            };
            self.compact_if_triggered(run, &setup, &mut own).await?;
            let mut outgoing = self
                .outgoing(
                    run,
                    &call,
                    setup.system.as_ref(),
                    own.messages(),
                    &target,
                    &mut memory,
                )
                .await?;
            outgoing.prepared.fit.prefix = previous
                .as_deref()
                .map(|previous| PrefixReuse::between(previous, &outgoing.messages));
            previous = Some(outgoing.messages.clone());
            outgoing.reply_tokens = self
                .check_budget_before(
                    run,
                    &setup.model,
                    &outgoing.breakdown,
                    outgoing.reply_tokens,
                )
                .await?;
            let (end, reply) = self.call(run, &setup, &call, &outgoing).await?;
            let reply = run.hooks.iter().try_fold(reply, |reply, hook| {
                hook.after_llm_call(&call, reply)
                    .map_err(|error| HookFailed::new(&**hook, HookPoint::AfterLlmCall, error))
            })?;
            // A reply that goes on into tool calls enters the step's log in the same append
            // as its request's end, which then stores it once (by reference); unless what the
            // call spent stops the step, whose log then ends before the reply.
            let goes_on = !reply.tool_calls.is_empty() && round + 1 < assistant.max_iterations;
            let mut events = vec![EventKind::RequestEnded(end.clone())];
            if goes_on && self.check_budget_after(run, Some(&end)).is_ok() {
                events.push(EventKind::StepMessage(StepMessage {
                    step: info.step,
                    message: reply.clone(),
                }));
            }
            let recorded_reply = events.len() == 2;
            self.append(run, events).await?;
            self.check_budget_after(run, None)?;
            if reply.tool_calls.is_empty() {
                return Ok(reply.text());
            }
            if !recorded_reply {
                break;
            }
            own.push(reply.clone());
            self.answer_tool_calls(run, &setup, &reply.tool_calls, &mut own)
                .await?;
        }
        Err(StepError::MaxIterations {
            assistant: assistant.id.clone(),
            max: assistant.max_iterations,
        }
        .into())
    }

    /// Runs `calls` (a reply's tool calls) one after another, recording each result in the
    /// step's log and its loop; a cancellation stops the step between them.
    async fn answer_tool_calls(
        &self,
        run: &mut Run,
        setup: &AssistantSetup<'_>,
        calls: &[ToolCall],
        own: &mut LoopView,
    ) -> Result<(), Abort> {
        let step = setup.step.info.step;
        for tool_call in calls {
            let (id, seq) = run.cancel_source();
            let text = tokio::select! {
                biased;
                text = self.run_tool_call(run, setup, tool_call, own) => text?,
                request = self.cancellation(&id, seq) => {
                    return Err(self.cancel_step(run, step, own.own(), request).await);
                }
            };
            let result = Message::tool_result(tool_call.id.clone(), text);
            self.record_step_message(run, step, result.clone()).await?;
            own.push(result);
        }
        Ok(())
    }

    /// Goes on from the tool loop an interrupted attempt of this step recorded (see
    /// [`StepContext::carried`]): its messages are recorded again as this step's, so that
    /// its log holds its whole loop, and the tool calls of its last turn that have no result
    /// yet are run (they were in flight). Returns the round the loop goes on with: the
    /// model's turns it had are not asked for again.
    async fn carry_on(
        &self,
        run: &mut Run,
        setup: &AssistantSetup<'_>,
        own: &mut LoopView,
    ) -> Result<u32, Abort> {
        let carried = &setup.step.carried;
        if carried.is_empty() {
            return Ok(0);
        }
        let step = setup.step.info.step;
        self.append(
            run,
            carried
                .iter()
                .map(|message| {
                    EventKind::StepMessage(StepMessage {
                        step,
                        message: message.clone(),
                    })
                })
                .collect(),
        )
        .await?;
        for message in carried {
            own.push(message.clone());
        }
        let turns = carried
            .iter()
            .filter(|message| !message.tool_calls.is_empty())
            .count();
        // The calls of its last turn that were in flight.
        let unanswered: Vec<ToolCall> = unanswered_calls(carried).into_iter().cloned().collect();
        self.answer_tool_calls(run, setup, &unanswered, own).await?;
        Ok(u32::try_from(turns).unwrap_or(u32::MAX))
    }

    /// Fits the request, then passes it through the hooks.
    async fn outgoing(
        &self,
        run: &mut Run,
        call: &CallInfo,
        system: Option<&Message>,
        own: &[Message],
        target: &FitTarget<'_>,
        memory: &mut CutMemory,
    ) -> Result<Outgoing, Abort> {
        let build = |run: &Run, memory: &mut CutMemory| -> Result<FittedRequest, StepError> {
            let projection = run.log.thread().projection();
            let system = system.or(projection.system.as_ref());
            fit_request_in_loop(system, projection.messages, own, target, memory)
                .map_err(StepError::from)
        };
        let mut prepared = build(run, memory)?;
        let mut messages = prepared.messages.clone();
        let mut breakdown = prepared.breakdown.clone();
        // The run is appended to below: the chain is held apart from it (one `Arc` count each).
        let hooks = run.hooks.clone();
        for (index, hook) in hooks.iter().enumerate() {
            let decision = hook
                .before_llm_call(call, &messages)
                .map_err(|error| HookFailed::new(&**hook, HookPoint::BeforeLlmCall, error))?;
            match decision {
                BeforeCall::Continue => {}
                BeforeCall::View(view) => {
                    let limit = prepared.limits.limit;
                    (messages, breakdown) = check_view(hook.name(), view, target, limit)?;
                }
                BeforeCall::Record(_) if run.staging.is_some() => {
                    // Items running at once share one history; a change one of them made
                    // would have been made without the others' knowledge.
                    return Err(HookFailed::new(
                        &**hook,
                        HookPoint::BeforeLlmCall,
                        HookError::new(
                            "it changed the shared history in an item of an iteration whose items run at once; such a hook needs max_concurrency: 1",
                        ),
                    )
                    .into());
                }
                BeforeCall::Record(change) => {
                    let events = match change {
                        HistoryChange::Append(added) => added
                            .into_iter()
                            .map(|message| EventKind::MessageAppended { message })
                            .collect(),
                        HistoryChange::Replace(replacement) => {
                            vec![EventKind::ContextReplaced(
                                ContextReplace::new(
                                    format!(
                                        "{}/step-{}/call-{}/hook-{index}",
                                        run.id, call.step.step, call.round
                                    ),
                                    ReplaceReason::Manual,
                                    run.log.thread().last_seq(),
                                    replacement,
                                )
                                .in_context(run.log.thread().active_context()),
                            )]
                        }
                    };
                    self.append(run, events).await?;
                    prepared = build(run, memory)?;
                    messages = prepared.messages.clone();
                    breakdown = prepared.breakdown.clone();
                }
            }
        }
        Ok(Outgoing {
            messages,
            breakdown,
            reply_tokens: prepared.limits.reserve_output,
            prepared,
        })
    }

    /// Sends one request, recording it before. A failed or cancelled call's end is recorded
    /// here; a completed call's end is returned with the reply, for the caller to record.
    async fn call(
        &self,
        run: &mut Run,
        setup: &AssistantSetup<'_>,
        call: &CallInfo,
        outgoing: &Outgoing,
    ) -> Result<(RequestEnd, Message), Abort> {
        let AssistantSetup {
            assistant,
            route,
            model,
            tools,
            ..
        } = setup;
        let request_id = format!("{}/step-{}/call-{}", run.id, call.step.step, call.round);
        let limits = outgoing.prepared.limits;
        self.append(
            run,
            vec![EventKind::RequestStarted(RequestRecord {
                request_id: request_id.clone(),
                model: Some(route.model.clone()),
                messages: outgoing.messages.clone(),
                budget: Some(RecordedBudget {
                    context_window: limits.context_window,
                    max_output_tokens: outgoing.reply_tokens,
                    input_tokens: outgoing.breakdown.used,
                }),
                step: Some(call.step.step),
                tools: tools.to_vec(),
                breakdown: Some(outgoing.breakdown.clone()),
                fit: Some(outgoing.prepared.fit.clone()),
                purpose: None,
                client_digest: None,
                pruned: None,
                input_from: None,
                client: None,
                reasoning_not_sent: None,
            })],
        )
        .await?;
        let mut request = ChatRequest::new(route.model.clone(), outgoing.messages.clone());
        request.tools = tools.to_vec();
        request.max_tokens = Some(outgoing.reply_tokens);
        request.temperature = assistant.temperature;
        let (id, seq) = run.cancel_source();
        let response = tokio::select! {
            biased;
            response = self.send(run, call, route, &request) => response,
            cancel = self.cancellation(&id, seq) => {
                let mut end =
                    RequestEnd::new(&request_id, RequestOutcome::Cancelled, Usage::default());
                end.error = Some(cancel_text(cancel.reason.as_deref()));
                self.append(run, vec![EventKind::RequestEnded(end)]).await?;
                return Err(StepError::Cancelled { reason: cancel.reason }.into());
            }
        };
        let end = request_end(&request_id, &response, model, outgoing.breakdown.used);
        match response {
            Ok(response) => {
                let estimated =
                    crate::estimates::uncalibrated_estimate(model, &outgoing.messages, tools);
                crate::estimates::observe(
                    &self.store,
                    model,
                    &self.learner,
                    estimated,
                    response.usage,
                )
                .await
                .map_err(ExecError::from)?;
                Ok((end, response.message))
            }
            Err(error) => {
                self.append(run, vec![EventKind::RequestEnded(end)]).await?;
                Err(StepError::Llm(error).into())
            }
        }
    }

    /// The provider call itself, streamed when streaming is on.
    async fn send(
        &self,
        run: &Run,
        call: &CallInfo,
        route: &Route,
        request: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        if !self.stream {
            return route.provider.complete(request).await;
        }
        let observer = self.observer.clone();
        let execution_id = run.id.clone();
        let step = call.step.step;
        let mut on_delta = move |delta: contexture_llm::StreamDelta| {
            if let Some(observer) = &observer {
                observer.on_delta(&execution_id, step, &delta);
            }
        };
        route.provider.stream(request, &mut on_delta).await
    }

    /// Refuses a request that would take the execution (and its tree: the run's limits bound
    /// its sub-workflows too) to its token or cost budget, and otherwise returns the most
    /// tokens its reply may take without passing either, at most `wanted`: the request's
    /// reply is capped to it, so the budget holds the reply too. An item running at once
    /// with others reserves the call's most (its request and that reply) in the items'
    /// ledger, so the calls in flight together hold the budget as one at a time would.
    async fn check_budget_before(
        &self,
        run: &Run,
        model: &ModelInfo,
        breakdown: &BudgetBreakdown,
        wanted: u32,
    ) -> Result<u32, StepError> {
        let limits = run.limits;
        let request = u64::from(breakdown.used);
        let room =
            |spent: Spent| reply_room(limits, model, request, spent).map(|reply| reply.min(wanted));
        let Some(staging) = run
            .staging
            .as_ref()
            .filter(|_| limits.max_tokens.is_some() || limits.max_cost_usd.is_some())
        else {
            return room(run.budget_spent());
        };
        staging
            .ledger
            .reserve(
                staging.item,
                run.tree_spent(),
                |counted, spent, earliest| {
                    // The reply limit the spending alone allows; the others' calls in flight
                    // are waited for rather than allowed to shorten it.
                    let reply = match room(spent) {
                        Ok(reply) => reply,
                        Err(error) if earliest => return Err(error),
                        // An earlier item may still spend first, as it would one at a time.
                        Err(_) => return Ok(Decision::Wait),
                    };
                    if reply < wanted && !earliest {
                        // A tight budget is spent in item order.
                        return Ok(Decision::Wait);
                    }
                    if room(counted).is_ok_and(|left| left >= reply) {
                        let most = Spent {
                            tokens: request + u64::from(reply),
                            cost_usd: model
                                .pricing
                                .map_or(0.0, |pricing| pricing.cost(request, u64::from(reply))),
                            steps: 0,
                        };
                        Ok(Decision::Start(reply, most))
                    } else {
                        Ok(Decision::Wait)
                    }
                },
            )
            .await
    }

    /// Stops the run once a call took the execution over a budget: what the log records,
    /// with the end of a call not yet recorded (`pending`) counted in.
    fn check_budget_after(&self, run: &Run, pending: Option<&RequestEnd>) -> Result<(), StepError> {
        let tree = run.budget_spent();
        let pending_usage = pending.map(|end| end.usage).unwrap_or_default();
        let spent = tree.tokens + pending_usage.input_tokens + pending_usage.output_tokens;
        if let Some(limit) = run.limits.max_tokens
            && spent > limit
        {
            return Err(StepError::TokenBudget {
                spent,
                request: None,
                limit,
            });
        }
        let cost = tree.cost_usd + pending.and_then(|end| end.cost_usd).unwrap_or(0.0);
        if let Some(limit) = run.limits.max_cost_usd
            && cost > limit
        {
            return Err(StepError::CostBudget {
                spent: cost,
                request: None,
                limit,
            });
        }
        Ok(())
    }

    /// Stops a step that a cancellation reached: the calls of its last tool-calling turn
    /// that have no result get a synthetic "cancelled" result in the step's log, so the
    /// step's own history stays valid.
    async fn cancel_step(
        &self,
        run: &mut Run,
        step: u64,
        own: &[Message],
        request: CancelRequest,
    ) -> Abort {
        let events: Vec<EventKind> = cancelled_results(own)
            .into_iter()
            .map(|message| EventKind::StepMessage(StepMessage { step, message }))
            .collect();
        if !events.is_empty()
            && let Err(error) = self.append(run, events).await
        {
            return Abort::Exec(error);
        }
        StepError::Cancelled {
            reason: request.reason,
        }
        .into()
    }

    async fn record_step_message(
        &self,
        run: &mut Run,
        step: u64,
        message: Message,
    ) -> Result<(), Abort> {
        self.append(
            run,
            vec![EventKind::StepMessage(StepMessage { step, message })],
        )
        .await?;
        Ok(())
    }

    /// The tools of the MCP servers `assistant` names, starting the servers the run has
    /// not started yet.
    async fn mcp_tools(
        &self,
        run: &Run,
        step: &StepContext<'_>,
        assistant: &Assistant,
    ) -> Result<Vec<OfferedTool>, StepError> {
        if assistant.mcp_servers.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = assistant
            .mcp_servers
            .iter()
            .map(|used| used.name())
            .collect();
        let execution = run.id.as_str();
        let observer = self.observer.as_deref();
        let progress = |progress: McpProgress| {
            if let Some(observer) = observer {
                observer.on_mcp_server(execution, &progress);
            }
        };
        let offered = run
            .mcp
            .offer(
                &names,
                step.workflow,
                &self.tools,
                &step.store,
                &step.options,
                &progress,
            )
            .await?;
        if let Some(clash) = offered.iter().find(|o| assistant.tools.contains(&o.name)) {
            return Err(StepError::from(contexture_mcp::McpError::InvalidTool {
                server: clash.session.server().to_owned(),
                problem: format!(
                    "tool `{}` is offered as `{}`, which is also the id of a tool of assistant `{}`",
                    clash.tool, clash.name, assistant.id
                ),
            }));
        }
        Ok(offered)
    }

    /// Runs one tool call of the model. Whatever goes wrong with the call becomes the result
    /// text, so the model can see it and recover; an MCP server that stopped or hung fails
    /// the step.
    async fn run_tool_call(
        &self,
        run: &mut Run,
        setup: &AssistantSetup<'_>,
        call: &contexture_core::ToolCall,
        own: &mut LoopView,
    ) -> Result<String, Abort> {
        let assistant = setup.assistant;
        let StepContext {
            info,
            workflow,
            store,
            options,
            ..
        } = setup.step;
        let tool = assistant
            .tools
            .iter()
            .any(|tool| *tool == *call.name)
            .then(|| workflow.tool(&call.name))
            .flatten();
        let Some(tool) = tool else {
            if let Some(offered) = setup.mcp_tools.iter().find(|o| *o.name == *call.name) {
                return call_mcp_tool(offered, &call.arguments).await;
            }
            let available: Vec<&str> = assistant
                .tools
                .iter()
                .map(String::as_str)
                .chain(setup.mcp_tools.iter().map(|o| o.name.as_str()))
                .collect();
            return Ok(format!(
                "error: there is no tool `{}` (available: {})",
                call.name,
                available.join(", ")
            ));
        };
        let model_arguments = match parse_model_arguments(&call.arguments) {
            Ok(arguments) => arguments,
            Err(error) => return Ok(format!("error: {error}")),
        };
        let configured = match configured_arguments(tool, None, store, options) {
            Ok(configured) => configured,
            Err(error) => return Ok(format!("error: {error}")),
        };
        let arguments = merge_arguments(model_arguments, configured);
        if is_context_manager(tool) {
            let model = self.router.route(&assistant.model).model;
            return Ok(self
                .context_manager(
                    run,
                    assistant.compaction.as_ref(),
                    &arguments,
                    &model,
                    info.step,
                    Some(own),
                )
                .await
                .unwrap_or_else(|error| format!("error: {error}")));
        }
        Ok(
            match self.tools.run(tool, arguments, store, options).await {
                Ok(text) => text,
                Err(error) => format!("error: {error}"),
            },
        )
    }
}

/// Calls an MCP server's tool with the model's arguments, as they are (no configured
/// argument exists to keep). A result the server marks as failed reads as an error to the
/// model; a server that stopped or hung fails the step.
async fn call_mcp_tool(offered: &OfferedTool, arguments: &str) -> Result<String, Abort> {
    let arguments = match parse_model_arguments(arguments) {
        Ok(arguments) => arguments,
        Err(error) => return Ok(format!("error: {error}")),
    };
    let output = offered
        .session
        .call(&offered.tool, arguments, offered.timeout)
        .await
        .map_err(StepError::from)?;
    Ok(if output.is_error {
        format!("error: {}", output.text)
    } else {
        output.text
    })
}

/// The most tokens a reply may take after a request of `request` tokens, once the tree has
/// spent `spent`, without passing `limits` (`u32::MAX` without token or cost budgets); a
/// request that leaves no room for any reply is refused.
fn reply_room(
    limits: RunLimits,
    model: &ModelInfo,
    request: u64,
    spent: Spent,
) -> Result<u32, StepError> {
    let mut reply = u64::from(u32::MAX);
    if let Some(limit) = limits.max_tokens {
        // A request that leaves no token for its reply cannot complete within it.
        if spent.tokens + request >= limit {
            return Err(StepError::TokenBudget {
                spent: spent.tokens,
                request: Some(request),
                limit,
            });
        }
        reply = reply.min(limit - spent.tokens - request);
    }
    if let Some(limit) = limits.max_cost_usd {
        let pricing = model.pricing.ok_or_else(|| StepError::NoPrice {
            model: model.id.clone(),
        })?;
        let request = pricing.cost(request, 0);
        let left = limit - spent.cost_usd - request;
        let affordable = if pricing.output_per_mtok > 0.0 {
            (left.max(0.0) * 1_000_000.0 / pricing.output_per_mtok).floor() as u64
        } else {
            u64::MAX
        };
        if left <= 0.0 || affordable == 0 {
            return Err(StepError::CostBudget {
                spent: spent.cost_usd,
                request: Some(request),
                limit,
            });
        }
        reply = reply.min(affordable);
    }
    Ok(u32::try_from(reply).unwrap_or(u32::MAX))
}
