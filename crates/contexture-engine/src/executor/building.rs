//! Building an executor: its parts (store, router, registry, tools, hooks, observer,
//! limits, isolation) and the same executor over another store.

use std::sync::Arc;
use std::time::Duration;

use contexture_core::context::{RenderIsolation, RenderOptions};
use contexture_core::registry::Registry;
use contexture_core::thread::RunLimits;
use contexture_store::Store;

use crate::hooks::Hook;
use crate::llm::Router;
use crate::sources::{FileSource, WorkflowSource};
use crate::tools::Toolbox;
use crate::workflow::Programs;

use super::{Executor, Observer};

impl<S: Store> Executor<S> {
    /// An executor over `store` whose LLM calls go where `router` says; the built-in model
    /// registry and tools, no hooks, the system clock and random ids for templates.
    pub fn new(store: S, router: Arc<dyn Router>) -> Executor<S> {
        Executor {
            store,
            router,
            registry: Arc::new(Registry::builtin()),
            tools: Toolbox::default(),
            hooks: Vec::new(),
            observer: None,
            render: crate::system::render_options(None),
            limits: RunLimits::default(),
            stream: false,
            sources: Arc::new(FileSource),
            cancel_poll: Duration::from_millis(250),
            programs: Programs::Allowed,
            caps: RunLimits::default(),
            client_isolation: None,
            learner: crate::estimates::Learner::Operator,
        }
    }

    /// Builder: whether operator workflows may start programs on this host (`command`
    /// tools, MCP servers started as programs). Default: allowed. A client's workflow never
    /// may, whatever this says.
    pub fn with_programs(mut self, programs: Programs) -> Executor<S> {
        self.programs = programs;
        self
    }

    /// Builder: where sub-workflows are read from (default: files, relative to the parent's).
    pub fn with_workflow_source(mut self, sources: Arc<dyn WorkflowSource>) -> Executor<S> {
        self.sources = sources;
        self
    }

    /// Where sub-workflows are read from.
    pub fn sources(&self) -> &Arc<dyn WorkflowSource> {
        &self.sources
    }

    /// Builder: how often a running step looks for a cancellation asked for by another
    /// process (default 250 ms).
    pub fn with_cancel_poll(mut self, interval: Duration) -> Executor<S> {
        self.cancel_poll = interval;
        self
    }

    /// Builder: the model registry (windows, tokenizers, prices).
    pub fn with_registry(mut self, registry: Arc<Registry>) -> Executor<S> {
        self.registry = registry;
        self
    }

    /// Builder: the tool implementations.
    pub fn with_tools(mut self, tools: Toolbox) -> Executor<S> {
        self.tools = tools;
        self
    }

    /// Builder: adds a hook after those already added.
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Executor<S> {
        self.hooks.push(hook);
        self
    }

    /// Builder: the observer of events and streamed pieces.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Executor<S> {
        self.observer = Some(observer);
        self
    }

    /// Builder: the clock, ids and variables templates see.
    pub fn with_render_options(mut self, options: RenderOptions) -> Executor<S> {
        self.render = options;
        self
    }

    /// Builder: limits that override the workflow's (and, on resume, the recorded ones).
    pub fn with_limits(mut self, limits: RunLimits) -> Executor<S> {
        self.limits = limits;
        self
    }

    /// Builder: ceilings on every run's limits: a workflow (or [`Executor::with_limits`])
    /// may set lower ones, never higher, and a limit nobody sets is the ceiling.
    pub fn with_limit_caps(mut self, caps: RunLimits) -> Executor<S> {
        self.caps = caps;
        self
    }

    /// Builder: whose calibration of token estimates the runs read and feed (default the
    /// operator's; a server's executions read it and feed nothing, since a client shapes
    /// their requests).
    pub fn with_estimate_learner(mut self, learner: crate::estimates::Learner) -> Executor<S> {
        self.learner = learner;
        self
    }

    /// Builder: render the templates and expressions of workflows a client sent through
    /// `isolation` (worker processes whose memory and time are bounded), not in this
    /// process. Without it they render here, bounded only by fuel and the output limit.
    pub fn with_client_isolation(mut self, isolation: Arc<dyn RenderIsolation>) -> Executor<S> {
        self.client_isolation = Some(isolation);
        self
    }

    /// Builder: stream replies (the observer sees each piece as it arrives).
    pub fn with_streaming(mut self, stream: bool) -> Executor<S> {
        self.stream = stream;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// This executor, set up as it is, over another store: a tenant's view of this one
    /// (see [`contexture_store::Scoped`]), so that the runs it starts see only the tenant's
    /// threads.
    pub fn on_store<T: Store>(&self, store: T) -> Executor<T> {
        Executor {
            store,
            router: self.router.clone(),
            registry: self.registry.clone(),
            tools: self.tools.clone(),
            hooks: self.hooks.clone(),
            observer: self.observer.clone(),
            render: self.render.clone(),
            limits: self.limits,
            stream: self.stream,
            sources: self.sources.clone(),
            cancel_poll: self.cancel_poll,
            programs: self.programs.clone(),
            caps: self.caps,
            client_isolation: self.client_isolation.clone(),
            learner: self.learner.clone(),
        }
    }
}
