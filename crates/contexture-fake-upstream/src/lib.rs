//! A fake LLM provider for Contexture's tests: an HTTP server on 127.0.0.1 that speaks the
//! OpenAI chat-completions and Anthropic messages wire formats, answers from a script, and
//! records every request it receives.
//!
//! The providers, the engine, the server and the `contexture` binary are all tested against
//! an upstream over real HTTP. This crate is that upstream, shared by every crate's tests, so
//! that a scripted answer looks the same whichever test asked for it and a test can check
//! exactly what was sent. It is a dev-dependency only and is never published.
//!
//! It serves:
//!
//! - `POST /v1/chat/completions`: an OpenAI chat completion, whole or as server-sent events
//!   when the request says `"stream": true`;
//! - `POST /v1/messages`: the same answers in Anthropic's messages format;
//! - `GET /v1/models`: a list naming [`MODEL`], unless scripted otherwise
//!   ([`FakeUpstream::push_models_reply`]).
//!
//! Any other request is recorded and answered 404.
//!
//! Each call to a model (the first two routes) takes the next scripted [`Reply`]. When none is
//! left, the fallback answers: `reply N` for the Nth call unless [`FakeUpstream::otherwise`]
//! or [`FakeUpstream::fail_when_unscripted`] says otherwise.
//!
//! ```no_run
//! use contexture_fake_upstream::{FakeUpstream, Reply};
//!
//! # async fn example() {
//! let upstream = FakeUpstream::start().await;
//! upstream.push(Reply::text("Sunny.").usage(21, 5));
//! // Point the client at `upstream.base_url()` and make one call, then:
//! assert_eq!(upstream.calls()[0].json["model"], "gpt-4o");
//! # }
//! ```
//!
//! Start it with [`FakeUpstream::start`] from an async test, or with
//! [`FakeUpstream::start_on`] from a synchronous test that owns a runtime.

mod render;
mod reply;
mod request;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use serde_json::json;
use tokio::net::TcpListener;

pub use axum::http::HeaderMap;
pub use reply::Reply;
pub use request::Request;

/// The model the fake names in its answers and in its model list, unless a reply says
/// otherwise ([`Reply::model`]).
pub const MODEL: &str = "gpt-4o-mini";

/// Answers a call to a model that finds no scripted reply left: given the call's number
/// (1 for the first) and the request.
type Fallback = dyn Fn(usize, &Request) -> Reply + Send + Sync;

/// A running fake upstream. Clones share the same server, script and record; the server runs
/// until its runtime shuts down.
#[derive(Clone)]
pub struct FakeUpstream {
    script: Arc<Mutex<Script>>,
    origin: String,
}

/// What the fake will answer and what it has received.
struct Script {
    /// Replies to calls to a model, in order.
    calls: VecDeque<Reply>,
    /// Replies to `GET /v1/models`, in order.
    models: VecDeque<Reply>,
    fallback: Arc<Fallback>,
    /// Every request, in the order received (while `keep_requests`).
    received: Vec<Request>,
    /// Whether requests are kept (a long benchmark's would fill the memory).
    keep_requests: bool,
    /// How many of them were calls to a model.
    call_count: usize,
}

/// The routes the fake tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    ChatCompletions,
    AnthropicMessages,
    Models,
    Unknown,
}

impl Endpoint {
    fn of(method: &Method, path: &str) -> Endpoint {
        match (method, path) {
            (&Method::POST, "/v1/chat/completions") => Endpoint::ChatCompletions,
            (&Method::POST, "/v1/messages") => Endpoint::AnthropicMessages,
            (&Method::GET, "/v1/models") => Endpoint::Models,
            _ => Endpoint::Unknown,
        }
    }
}

impl FakeUpstream {
    /// Starts a fake on a free loopback port, served by the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or when no loopback port can be bound.
    pub async fn start() -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake upstream to a loopback port");
        let upstream = FakeUpstream::listening_on(&listener);
        tokio::spawn(serve(listener, upstream.script.clone()));
        upstream
    }

    /// Starts a fake on a free loopback port, served by `runtime`: for synchronous tests,
    /// which keep `runtime` alive as long as the fake is needed.
    ///
    /// # Panics
    ///
    /// Inside an async context (it blocks on `runtime`), or when no loopback port can be
    /// bound.
    pub fn start_on(runtime: &tokio::runtime::Runtime) -> FakeUpstream {
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind the fake upstream to a loopback port");
        let upstream = FakeUpstream::listening_on(&listener);
        runtime.spawn(serve(listener, upstream.script.clone()));
        upstream
    }

    /// Starts a fake that answers exactly `replies`, in order, and any call after them with
    /// a 500 ([`FakeUpstream::fail_when_unscripted`]): for tests that say every answer.
    pub async fn scripted(replies: impl IntoIterator<Item = Reply>) -> FakeUpstream {
        let upstream = FakeUpstream::start().await;
        upstream.fail_when_unscripted().extend(replies);
        upstream
    }

    fn listening_on(listener: &TcpListener) -> FakeUpstream {
        let address = listener.local_addr().expect("the fake upstream's address");
        FakeUpstream {
            script: Arc::new(Mutex::new(Script {
                calls: VecDeque::new(),
                models: VecDeque::new(),
                fallback: Arc::new(|number, _: &Request| Reply::text(format!("reply {number}"))),
                received: Vec::new(),
                keep_requests: true,
                call_count: 0,
            })),
            origin: format!("http://{address}"),
        }
    }

    /// Starts a fake on `address` (such as `127.0.0.1:9000`), served by the current tokio
    /// runtime: for a fake in a process of its own.
    pub async fn start_at(address: &str) -> std::io::Result<FakeUpstream> {
        let listener = TcpListener::bind(address).await?;
        let upstream = FakeUpstream::listening_on(&listener);
        tokio::spawn(serve(listener, upstream.script.clone()));
        Ok(upstream)
    }

    /// Keeps no more requests from now on ([`FakeUpstream::requests`] and
    /// [`FakeUpstream::calls`] stay as they are; calls are still counted): for a fake under a
    /// long load.
    pub fn forget_requests(&self) -> &FakeUpstream {
        self.lock().keep_requests = false;
        self
    }

    /// The OpenAI-style base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.origin)
    }

    /// The server's origin, `http://127.0.0.1:PORT`: the base URL of clients that add `/v1`
    /// themselves, such as Anthropic's.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Queues `reply` for a call to a model, after those already queued.
    pub fn push(&self, reply: Reply) -> &FakeUpstream {
        self.lock().calls.push_back(reply);
        self
    }

    /// Queues `replies`, in order, after those already queued.
    pub fn extend(&self, replies: impl IntoIterator<Item = Reply>) -> &FakeUpstream {
        self.lock().calls.extend(replies);
        self
    }

    /// Queues `reply` for `GET /v1/models`; with none queued, it lists [`MODEL`].
    pub fn push_models_reply(&self, reply: Reply) -> &FakeUpstream {
        self.lock().models.push_back(reply);
        self
    }

    /// Answers a call to a model that finds no scripted reply left with `fallback`, given the
    /// call's number (1 for the first call) and the request.
    pub fn otherwise(
        &self,
        fallback: impl Fn(usize, &Request) -> Reply + Send + Sync + 'static,
    ) -> &FakeUpstream {
        self.lock().fallback = Arc::new(fallback);
        self
    }

    /// Answers a call to a model that finds no scripted reply left with a 500, so that a
    /// client calling more often than its test expected fails loudly.
    pub fn fail_when_unscripted(&self) -> &FakeUpstream {
        self.otherwise(|_, _| Reply::error(500, "the fake upstream has no reply left"))
    }

    /// Every request received so far, whatever its route, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.lock().received.clone()
    }

    /// The calls to a model received so far (`POST /v1/chat/completions` and
    /// `POST /v1/messages`), in order.
    pub fn calls(&self) -> Vec<Request> {
        self.lock()
            .received
            .iter()
            .filter(|request| request.is_call())
            .cloned()
            .collect()
    }

    /// The `index`-th call to a model (0 for the first).
    ///
    /// # Panics
    ///
    /// When there were not that many calls.
    #[track_caller]
    pub fn call(&self, index: usize) -> Request {
        let calls = self.calls();
        calls.get(index).cloned().unwrap_or_else(|| {
            panic!(
                "the fake upstream got {} calls, not {}",
                calls.len(),
                index + 1
            )
        })
    }

    /// The JSON bodies of the calls to a model so far, in order.
    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.calls().into_iter().map(|call| call.json).collect()
    }

    /// How many calls to a model it has received.
    pub fn call_count(&self) -> usize {
        self.lock().call_count
    }

    /// Waits until it has received `count` calls to a model.
    ///
    /// # Panics
    ///
    /// When they have not all come `within` that long.
    pub async fn wait_for_calls(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.call_count() < count {
            self.assert_before(deadline, count, within);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`FakeUpstream::wait_for_calls`] for synchronous tests: sleeps the thread between
    /// looks.
    ///
    /// # Panics
    ///
    /// When the calls have not all come `within` that long.
    #[track_caller]
    pub fn wait_for_calls_blocking(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.call_count() < count {
            self.assert_before(deadline, count, within);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[track_caller]
    fn assert_before(&self, deadline: Instant, count: usize, within: Duration) {
        assert!(
            Instant::now() < deadline,
            "the fake upstream got {} of {count} calls within {within:?}",
            self.call_count()
        );
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        lock(&self.script)
    }
}

fn lock(script: &Mutex<Script>) -> MutexGuard<'_, Script> {
    // Nothing panics while holding the lock (the fallback runs outside it).
    script.lock().expect("the fake upstream's script")
}

async fn serve(listener: TcpListener, script: Arc<Mutex<Script>>) {
    let app = Router::new().fallback(answer).with_state(script);
    axum::serve(listener, app)
        .await
        .expect("the fake upstream serves");
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let endpoint = Endpoint::of(&method, uri.path());
    let request = Request::new(method.as_str(), uri.path(), headers, body, endpoint);
    let (scripted, fallback, number) = {
        let mut script = lock(&script);
        if script.keep_requests {
            script.received.push(request.clone());
        }
        let scripted = match endpoint {
            Endpoint::ChatCompletions | Endpoint::AnthropicMessages => {
                script.call_count += 1;
                script.calls.pop_front()
            }
            Endpoint::Models => Some(script.models.pop_front().unwrap_or_else(|| {
                Reply::json(
                    200,
                    json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}),
                )
            })),
            Endpoint::Unknown => Some(Reply::error(
                404,
                &format!(
                    "the fake upstream does not serve {} {}",
                    request.method, request.path
                ),
            )),
        };
        (scripted, script.fallback.clone(), script.call_count)
    };
    // The fallback runs outside the lock: it is the test's code, and may take its time.
    let reply = scripted.unwrap_or_else(|| fallback(number, &request));
    reply
        .respond(endpoint, number, request.wants_stream())
        .await
}
