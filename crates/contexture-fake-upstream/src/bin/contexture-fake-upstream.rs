//! The fake upstream in a process of its own, for benchmarks of the chat endpoint:
//! `contexture-fake-upstream [ADDRESS]` (default `127.0.0.1:18090`) answers every call to a
//! model with a short text and its usage, whole or streamed as the request asks, keeps no
//! request, and runs until it is stopped.

use contexture_fake_upstream::{FakeUpstream, Reply};

fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18090".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let upstream = match FakeUpstream::start_at(&address).await {
            Ok(upstream) => upstream,
            Err(error) => {
                eprintln!("contexture-fake-upstream: cannot listen on {address}: {error}");
                std::process::exit(1);
            }
        };
        upstream
            .forget_requests()
            .otherwise(|number, _| Reply::text(format!("Noted, turn {number}.")).usage(120, 6));
        eprintln!("contexture-fake-upstream: serving {}", upstream.base_url());
        std::future::pending::<()>().await;
    });
}
