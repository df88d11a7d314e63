//! `contexture serve`'s app on 127.0.0.1 over real sockets, its test configuration and API
//! keys. The upstream of these tests is the workspace's shared fake, `contexture_fake_upstream`.

#![allow(dead_code)]

use std::time::Duration;

use contexture_server::issue_key;
use contexture_server::{AppState, ServerConfig, serve};
use contexture_store::AnyStore;
use tokio::sync::oneshot;

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its state (store, metrics).
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Serves `store` with `config` on a free port.
    pub async fn start(config: ServerConfig, store: AnyStore) -> TestServer {
        TestServer::serve(AppState::with_store(config, store).expect("server state")).await
    }

    /// Opens what `config` names (its database, its Redis) as `contexture serve` does, and
    /// serves it on a free port.
    pub async fn open(config: ServerConfig) -> TestServer {
        TestServer::serve(AppState::new(config).await.expect("server state")).await
    }

    async fn serve(state: AppState) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(state.clone(), listener, async move {
            let _ = stopped.await;
        }));
        TestServer {
            base,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A key for `tenant`.
    pub async fn key(&self, tenant: &str) -> String {
        issue_key(&self.state.store, tenant, "test")
            .await
            .unwrap()
            .key
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `method path` with the JSON `body` (if any) as `key`: the status and the JSON answer
    /// (null when it is not JSON).
    pub async fn call(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let mut request = client()
            .request(method.parse().unwrap(), self.url(path))
            .bearer_auth(key)
            .timeout(Duration::from_secs(30));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (
            status,
            response.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// The text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Stops accepting, waits for requests in flight, and returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A configuration for tests: no rate limit, upstream at `upstream` (if any), clients'
/// templates rendered by the `contexture` binary's template workers, as `contexture serve`
/// renders them.
pub fn config(upstream: Option<&str>) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.limits.requests_per_second = 0.0;
    config.executions.template_worker = Some(vec![
        contexture_binary().display().to_string(),
        "template-worker".to_owned(),
    ]);
    if let Some(url) = upstream {
        config.upstream.base_url = Some(url.to_owned());
        config.upstream.api_key = Some("sk-upstream-secret".into());
        config.upstream.timeout_secs = 10.0;
        config.upstream.retries = 0;
    }
    config
}

/// The `contexture` binary of this build, beside the test binaries (`cargo test
/// --workspace` builds it; `cargo build -p contexture-cli` does too).
pub fn contexture_binary() -> std::path::PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(std::path::Path::parent)
        .expect("test binaries live in target/PROFILE/deps");
    let binary = profile_dir.join(format!("contexture{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "the server tests start template workers from the contexture binary, which is not \
         built at {}: run `cargo build -p contexture-cli` (or test the whole workspace)",
        binary.display()
    );
    binary
}

/// An authenticated client call.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
