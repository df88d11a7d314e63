//! Prometheus metrics, served at `/metrics` in the text exposition format: requests and
//! their latencies by route, tokens counted, trims, compactions and store errors.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use contexture_engine::chat_service::ChatObserver;
use contexture_engine::compaction::{CompactionError, CompactionOutcome};
use contexture_engine::fitting::FittedRequest;
use contexture_store::StoreError;

use crate::error::StoreFailure;

/// The labels of a request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// The labels of a latency.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

/// The labels of a compaction.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

type LatencyFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    tokens_counted: Counter,
    trims: Counter,
    compactions: Family<OutcomeLabels, Counter>,
    store_errors: Counter,
    records_pruned: Counter,
    bytes_pruned: Counter,
    executions_taken: Family<OutcomeLabels, Counter>,
    executions_finished: Family<OutcomeLabels, Counter>,
    execution_leases_lost: Counter,
    shared_rate_limit_misses: Counter,
    execution_queue: Family<QueueLabels, Gauge>,
    executions_held: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    state: String,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 0.1 ms to about 13 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("contexture");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests answered", requests.clone());
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request (to the start of a streamed body)",
            latency.clone(),
        );
        let tokens_counted = Counter::default();
        registry.register(
            "tokens_counted",
            "Tokens of the requests fitted (projections returned and chat requests sent)",
            tokens_counted.clone(),
        );
        let trims = Counter::default();
        registry.register(
            "trims",
            "Fitted requests that left messages out to fit",
            trims.clone(),
        );
        let compactions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "compactions",
            "Compactions run, by outcome (compacted, skipped, failed)",
            compactions.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Requests that failed in the store",
            store_errors.clone(),
        );
        let records_pruned = Counter::default();
        registry.register(
            "request_records_pruned",
            "Request records whose messages the retention policies removed",
            records_pruned.clone(),
        );
        let bytes_pruned = Counter::default();
        registry.register(
            "request_record_bytes_pruned",
            "Bytes of request records the retention policies freed",
            bytes_pruned.clone(),
        );
        let executions_taken = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "executions_taken",
            "Runs this server took from the execution queue, by how (queued: waiting; adopted: their server stopped renewing its lease)",
            executions_taken.clone(),
        );
        let executions_finished = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "executions_finished",
            "Runs this server finished in the execution queue, by outcome (completed, failed, cancelled)",
            executions_finished.clone(),
        );
        let execution_leases_lost = Counter::default();
        registry.register(
            "execution_leases_lost",
            "Runs this server stopped because it could not renew their lease in time",
            execution_leases_lost.clone(),
        );
        let shared_rate_limit_misses = Counter::default();
        registry.register(
            "shared_rate_limit_misses",
            "Requests judged by this server's own rate limit bucket because the shared one (Redis or the database) did not answer",
            shared_rate_limit_misses.clone(),
        );
        let execution_queue = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "execution_queue",
            "Runs in the execution queue every server shares, by state (queued; running, its lease live; lapsed, its server gone and not yet adopted; finished), as of this scrape",
            execution_queue.clone(),
        );
        let executions_held = Gauge::default();
        registry.register(
            "executions_held",
            "Runs this server holds now",
            executions_held.clone(),
        );
        Metrics {
            registry,
            execution_queue,
            executions_held,
            executions_taken,
            executions_finished,
            execution_leases_lost,
            shared_rate_limit_misses,
            requests,
            latency,
            tokens_counted,
            trims,
            compactions,
            store_errors,
            records_pruned,
            bytes_pruned,
        }
    }
}

/// The chat turns' compactions and fits are counted; a failed compaction and a call whose end
/// could not be recorded are logged.
impl ChatObserver for Metrics {
    fn compacted(&self, thread: &str, outcome: &Result<CompactionOutcome, CompactionError>) {
        match outcome {
            Ok(outcome) => self.compaction(outcome),
            Err(error) => {
                self.compaction_error();
                tracing::warn!(%thread, %error, "compaction failed; trimming instead");
            }
        }
    }

    fn request_fitted(&self, fitted: &FittedRequest) {
        self.fitted(
            u64::from(fitted.breakdown.used),
            !fitted.fit.dropped.is_empty(),
        );
    }

    fn recording_failed(&self, tenant: &str, error: &StoreError) {
        tracing::error!(%error, %tenant, "cannot record how a chat request ended");
    }
}

impl Metrics {
    /// Counts the tokens of a fitted request, and whether it was trimmed.
    pub fn fitted(&self, tokens: u64, trimmed: bool) {
        self.tokens_counted.inc_by(tokens);
        if trimmed {
            self.trims.inc();
        }
    }

    /// Counts a compaction by its outcome (`compacted`, `skipped`, `failed`).
    pub fn compaction(&self, outcome: &CompactionOutcome) {
        self.count_compaction(match outcome {
            CompactionOutcome::Compacted { .. } => "compacted",
            CompactionOutcome::Skipped { .. } => "skipped",
            CompactionOutcome::Failed { .. } => "failed",
        });
    }

    /// Counts what a pruning of request records removed.
    pub fn count_pruned(&self, records: u64, bytes: u64) {
        self.records_pruned.inc_by(records);
        self.bytes_pruned.inc_by(bytes);
    }

    /// Counts a run taken from the execution queue: `adopted` when its server had stopped
    /// renewing its lease.
    pub fn count_taken_execution(&self, adopted: bool) {
        self.executions_taken
            .get_or_create(&OutcomeLabels {
                outcome: if adopted { "adopted" } else { "queued" }.to_owned(),
            })
            .inc();
    }

    /// Counts a run finished in the execution queue, by outcome.
    pub fn count_finished_execution(&self, outcome: &str) {
        self.executions_finished
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Sets the queue's counts and this server's share, read for a scrape.
    pub fn set_queue(&self, counts: Option<&contexture_store::QueueCounts>, held: usize) {
        if let Some(counts) = counts {
            for (state, count) in [
                ("queued", counts.queued),
                ("running", counts.running),
                ("lapsed", counts.lapsed),
                ("finished", counts.finished),
            ] {
                self.execution_queue
                    .get_or_create(&QueueLabels {
                        state: state.to_owned(),
                    })
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
        self.executions_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Counts a request judged by this server's own rate limit bucket because the shared one
    /// did not answer.
    pub fn count_shared_rate_limit_miss(&self) {
        self.shared_rate_limit_misses.inc();
    }

    /// Counts a run stopped because its lease could not be renewed in time.
    pub fn count_lost_lease(&self) {
        self.execution_leases_lost.inc();
    }

    /// Counts a compaction that ended in an error before it could report (as `failed`).
    pub fn compaction_error(&self) {
        self.count_compaction("failed");
    }

    fn count_compaction(&self, outcome: &str) {
        self.compactions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// A method as a label: one of the standard methods, else `other`, so that a client cannot
/// grow the metrics with methods of its own invention.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Middleware: counts each request and its latency under its route's pattern (never the
/// raw path, which holds ids), and store errors.
pub async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method()).to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    metrics
        .latency
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    if response.extensions().get::<StoreFailure>().is_some() {
        metrics.store_errors.inc();
    }
    response
}
