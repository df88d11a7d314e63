//! Threads on a store, as the CLI's `thread` commands keep them: `Store` (an SQLite file,
//! `sqlite:PATH`, or a PostgreSQL database) and `Thread` (append, read, fit for a model,
//! fork, merge, compact offline). A thread Python writes is one `contexture thread
//! messages` reads, and the other way round.
//!
//! The store is asynchronous; each call runs on the package's one runtime with the
//! interpreter released, so other Python threads go on while it waits on the disk.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use contexture_core::compact::{CompactionOutcome, CompactionPolicy};
use contexture_core::format::ItemFormat;
use contexture_core::thread::{ConflictPolicy, MergeKeys, MergePolicy, MergeSpec, ThreadPolicy};
use contexture_engine::compaction::{CompactOptions, Compactor, compact_stored};
use contexture_engine::estimates::Learner;
use contexture_engine::fit_report::FitReport;
use contexture_engine::fitting::{
    FitOverrides, FitSettings, MessageView, ModelChoice, fit_thread_reporting, thread_messages,
};
use contexture_engine::threads::{
    ThreadOpError, append_messages, clear_thread, fork_thread, merge_thread, pop_item,
    set_thread_policy_starting,
};
use contexture_store::{AnyStore, Store as _};
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::errors::{Kind, error, from_error};
use crate::json::to_python;
use crate::messages::{self, Format, Read};
use crate::tokens::registry;

/// The runtime every store call runs on: one worker, made on first use.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("contexture-store")
                .enable_all()
                .build()
                .map_err(|problem| problem.to_string())
        })
        .as_ref()
        .map_err(|problem| {
            error(
                Kind::Store,
                format!("cannot start the store's runtime: {problem}"),
            )
        })
}

/// Runs `work` to its end with the interpreter released.
fn block_on<F>(py: Python<'_>, work: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime()?;
    Ok(py.detach(|| runtime.block_on(work)))
}

fn store_error(problem: &(dyn std::error::Error + 'static)) -> PyErr {
    from_error(Kind::Store, problem)
}

/// A thread store: `sqlite:PATH` (made, with its tables, when missing) or a PostgreSQL
/// URL (`postgres://user@host/db`).
#[pyclass(name = "Store", module = "contexture", frozen)]
pub struct Store {
    store: Arc<AnyStore>,
    url: String,
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (url=String::from("sqlite:contexture.db")))]
    fn new(py: Python<'_>, url: String) -> PyResult<Store> {
        let opened = block_on(py, AnyStore::open(&url))?.map_err(|problem| {
            error(
                Kind::Store,
                format!("cannot open the store {url}: {problem}"),
            )
        })?;
        Ok(Store {
            store: Arc::new(opened),
            url,
        })
    }

    /// The thread `id` of this store (it need not exist yet: the first append makes it).
    fn thread(&self, id: String) -> Thread {
        Thread {
            store: self.store.clone(),
            id,
        }
    }

    /// Every thread: a dict each with `id`, `last_seq`, `parent`, `fork_seq`, sizes.
    fn threads<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let store = self.store.clone();
        let infos = block_on(py, async move { store.list().await })?
            .map_err(|problem| store_error(&problem))?;
        let list = PyList::empty(py);
        for info in infos {
            let value = serde_json::to_value(&info).map_err(|problem| store_error(&problem))?;
            list.append(to_python(py, &value)?)?;
        }
        Ok(list)
    }

    /// The store's URL.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.url)
    }
}

/// A durable, append-only thread: its messages are events, never rewritten; what a model
/// sees of it is a projection, fitted to the model's window.
#[pyclass(name = "Thread", module = "contexture", frozen)]
pub struct Thread {
    store: Arc<AnyStore>,
    id: String,
}

#[pymethods]
impl Thread {
    /// The thread `id` of the store at `db` (default `sqlite:contexture.db`, the CLI's).
    #[new]
    #[pyo3(signature = (id, db=String::from("sqlite:contexture.db")))]
    fn new(py: Python<'_>, id: String, db: String) -> PyResult<Thread> {
        Ok(Store::new(py, db)?.thread(id))
    }

    /// Its id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Appends `messages` (a list, or one message dict) in one transaction and returns
    /// their seqs. With `key`, a retry with the same key stores nothing and returns the
    /// first seqs; with `context`, they go to that named context.
    #[pyo3(signature = (messages, *, key=None, context=None, format="openai"))]
    fn append(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        key: Option<String>,
        context: Option<String>,
        format: &str,
    ) -> PyResult<Vec<u64>> {
        let format = Format::parse(format)?;
        let read = if messages.is_instance_of::<pyo3::types::PyDict>() && format == Format::OpenAi {
            let list = PyList::new(py, [messages])?;
            messages::read(list.as_any(), format)?
        } else {
            messages::read(messages, format)?
        };
        if read.messages.is_empty() {
            return Err(error(Kind::Input, "messages: the list holds no message"));
        }
        let store = self.store.clone();
        let id = self.id.clone();
        let appended = block_on(py, async move {
            append_messages(
                &*store,
                &id,
                read.messages,
                key.as_deref(),
                context.as_deref(),
            )
            .await
        })?
        .map_err(|problem| store_error(&problem))?;
        Ok(appended.seqs)
    }

    /// The thread's messages (its projection: the system prompt, then the conversation),
    /// or the last `limit` units of it (an assistant turn with its tool results is one
    /// unit), of the active context or the one named.
    #[pyo3(signature = (*, limit=None, context=None, format="openai"))]
    fn messages<'py>(
        &self,
        py: Python<'py>,
        limit: Option<usize>,
        context: Option<String>,
        format: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shape = Read::shape(Format::parse(format)?);
        let view = MessageView {
            context,
            limit,
            fit: None,
        };
        let store = self.store.clone();
        let id = self.id.clone();
        let read = block_on(
            py,
            async move { thread_messages(&*store, &id, &view).await },
        )?
        .map_err(|problem| store_error(&problem))?;
        messages::write(py, &read, &shape)
    }

    /// What a request to `model` would be sent of the thread: its projection fitted by the
    /// thread's own policy (else the defaults), as `Fitted(messages, report)`.
    #[pyo3(signature = (model, *, max_tokens=None, strategy=None, format="openai"))]
    fn context<'py>(
        &self,
        py: Python<'py>,
        model: String,
        max_tokens: Option<u32>,
        strategy: Option<String>,
        format: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shape = Read::shape(Format::parse(format)?);
        let overrides = FitOverrides {
            max_tokens,
            strategy: strategy
                .as_deref()
                .map(crate::fitting::parse_strategy)
                .transpose()?,
            ..FitOverrides::default()
        };
        let store = self.store.clone();
        let id = self.id.clone();
        let (settings, fitted) = block_on(py, async move {
            let settings = FitSettings::for_model(
                Some(&*store),
                registry(),
                ModelChoice::Named(&model),
                &Learner::Operator,
                Default::default(),
                overrides,
            )
            .await
            .map_err(|problem| from_error(Kind::Input, &problem))?;
            fit_thread_reporting(&*store, &id, &settings)
                .await
                .map_err(|problem| store_error(&problem))
        })??;
        let messages_in = fitted.messages.len()
            + fitted
                .fit
                .dropped
                .iter()
                .map(|[start, end]| end - start)
                .sum::<usize>();
        let report = FitReport::new(&settings, &fitted, messages_in)
            .map_err(|problem| from_error(Kind::Input, &problem))?;
        let report =
            serde_json::to_value(&report).map_err(|problem| from_error(Kind::Input, &problem))?;
        // The package's `Fitted` named tuple, as `contexture.fit` returns.
        let fitted_class = py.import("contexture")?.getattr("Fitted")?;
        fitted_class.call1((
            messages::write(py, &fitted.messages, &shape)?,
            to_python(py, &report)?,
        ))
    }

    /// Every event of the thread, oldest first, as dicts (`seq`, `kind`, ...).
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let store = self.store.clone();
        let id = self.id.clone();
        let events = block_on(py, async move { store.events(&id).await })?
            .map_err(|problem| store_error(&problem))?;
        let list = PyList::empty(py);
        for event in events {
            let value = serde_json::to_value(&event).map_err(|problem| store_error(&problem))?;
            list.append(to_python(py, &value)?)?;
        }
        Ok(list)
    }

    /// True when the thread has events.
    fn exists(&self, py: Python<'_>) -> PyResult<bool> {
        let store = self.store.clone();
        let id = self.id.clone();
        block_on(py, async move { store.exists(&id).await })?
            .map_err(|problem| store_error(&problem))
    }

    /// Forks the thread as `new_id` after its event `at` (default its last) and returns the
    /// fork: it shares the history up to there and goes on alone.
    #[pyo3(signature = (new_id, at=None))]
    fn fork(&self, py: Python<'_>, new_id: String, at: Option<u64>) -> PyResult<Thread> {
        let store = self.store.clone();
        let id = self.id.clone();
        let child = new_id.clone();
        block_on(
            py,
            async move { fork_thread(&*store, &id, at, &child).await },
        )?
        .map_err(|problem| store_error(&problem))?;
        Ok(Thread {
            store: self.store.clone(),
            id: new_id,
        })
    }

    /// Merges the fork `source` (a `Thread` or an id) back into this thread as one event
    /// and returns its seq. `policy`: `append-messages` (default), `summary-only` or
    /// `output-keys`; `conflict`: `child-wins` (default), `parent-wins`, `error` or
    /// `append`; `keys`: the fork's store keys to bring back (`all_keys` for every one).
    #[pyo3(signature = (source, *, policy="append-messages", conflict="child-wins", keys=Vec::new(), all_keys=false))]
    fn merge(
        &self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        policy: &str,
        conflict: &str,
        keys: Vec<String>,
        all_keys: bool,
    ) -> PyResult<u64> {
        let from = match source.cast::<Thread>() {
            Ok(thread) => thread.get().id.clone(),
            Err(_) => source
                .extract::<String>()
                .map_err(|_| error(Kind::Input, "source: expected a Thread or a thread id"))?,
        };
        let spec = MergeSpec {
            policy: kebab::<MergePolicy>("policy", policy)?,
            conflict: kebab::<ConflictPolicy>("conflict", conflict)?,
            keys: if all_keys {
                MergeKeys::All
            } else {
                MergeKeys::Listed(keys)
            },
        };
        let store = self.store.clone();
        let id = self.id.clone();
        block_on(
            py,
            async move { merge_thread(&*store, &id, &from, &spec).await },
        )?
        .map_err(|problem| store_error(&problem))
    }

    /// Summarizes the older part of the thread's active context with the offline
    /// extractive summarizer into one recorded replace (the events stay: nothing is lost,
    /// and the CLI's `thread restore` undoes it). Returns the report: `outcome`,
    /// `covered`, `tokens_before`, `tokens_after`, `summary`.
    #[pyo3(signature = (*, keep_tokens=None, keep_messages=None, summary_tokens=None, notes=None))]
    fn compact<'py>(
        &self,
        py: Python<'py>,
        keep_tokens: Option<u64>,
        keep_messages: Option<usize>,
        summary_tokens: Option<u32>,
        notes: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = CompactOptions {
            keep_tokens,
            keep_messages,
            summary_tokens,
            notes,
            ..CompactOptions::default()
        };
        let request = options
            .request(CompactionPolicy::default(), "manual")
            .map_err(|problem| from_error(Kind::Input, &problem))?;
        let store = self.store.clone();
        let id = self.id.clone();
        let report = block_on(py, async move {
            let compactor = Compactor::offline(Arc::new(registry().clone()));
            compact_stored(&compactor, &*store, &id, &request).await
        })?
        .map_err(|problem| store_error(&problem))?;
        if let CompactionOutcome::Failed { error: problem } = &report.outcome {
            return Err(error(
                Kind::Store,
                format!(
                    "compaction of thread {} failed and replaced nothing: {problem}",
                    self.id
                ),
            ));
        }
        let value = serde_json::to_value(&report).map_err(|problem| store_error(&problem))?;
        to_python(py, &value)
    }

    /// Removes the newest item of the conversation and returns it (`None` when it is
    /// empty): in the `responses` format the last item of the last turn (its last function
    /// call, say; the rest of the turn stays), in the `openai` format the last message. One
    /// replace event: the log keeps the item.
    #[pyo3(signature = (*, format="responses"))]
    fn pop_item<'py>(&self, py: Python<'py>, format: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let format = match Format::parse(format)? {
            Format::OpenAi => ItemFormat::Openai,
            Format::Responses => ItemFormat::Responses,
            Format::Anthropic => {
                return Err(error(
                    Kind::Input,
                    "format: items are popped in the openai or responses format",
                ));
            }
        };
        let store = self.store.clone();
        let id = self.id.clone();
        let popped =
            block_on(py, async move { pop_item(&*store, &id, format).await })?.map_err(op_error)?;
        popped.map(|item| to_python(py, &item)).transpose()
    }

    /// Empties the conversation (its system prompt and pinned messages stay) as one
    /// replace event; the log keeps every message. Returns the event's seq, or `None` when
    /// there was nothing to clear.
    fn clear(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let store = self.store.clone();
        let id = self.id.clone();
        block_on(py, async move { clear_thread(&*store, &id).await })?
            .map_err(|problem| store_error(&problem))
    }

    /// Sets the thread's own policy for its requests (`{"context": fit policy,
    /// "compaction": compaction policy}`), which `context()` and the server follow in
    /// place of the defaults; `None` removes it. A thread not there yet starts with it.
    /// Returns the event's seq.
    #[pyo3(signature = (policy))]
    fn set_policy(&self, py: Python<'_>, policy: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let policy: Option<ThreadPolicy> = match policy {
            Some(policy) if !policy.is_none() => {
                Some(crate::fitting::deserialize("policy", policy)?)
            }
            _ => None,
        };
        let store = self.store.clone();
        let id = self.id.clone();
        block_on(py, async move {
            set_thread_policy_starting(&*store, &id, policy).await
        })?
        .map_err(op_error)
    }

    fn __repr__(&self) -> String {
        format!("Thread({:?})", self.id)
    }
}

/// A thread operation's error: the store's as a `StoreError`, what was asked as an
/// `InputError`.
fn op_error(problem: ThreadOpError) -> PyErr {
    match problem {
        ThreadOpError::Store(store) => store_error(&store),
        other => from_error(Kind::Input, &other),
    }
}

/// A policy named in kebab case, as the CLI and the HTTP API spell it.
fn kebab<T: DeserializeOwned>(argument: &str, name: &str) -> PyResult<T> {
    serde_json::from_value(Value::String(name.to_owned()))
        .map_err(|problem| error(Kind::Input, format!("{argument}: {problem}")))
}
