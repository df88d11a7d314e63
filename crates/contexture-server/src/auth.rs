//! API keys and the rate limit. A key is `ctx_ID_SECRET`; only its SHA-256 is stored, bound
//! to one tenant. Requests carry it as `Authorization: Bearer KEY` (what OpenAI clients
//! send) or `X-API-Key: KEY`. Each key has its own token bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use contexture_store::{ApiKeyRecord, ApiKeyStore, RateLimit, RateLimitStore, StoreError};
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tenancy::Tenant;

/// A newly made key: the secret to hand out once, and what is stored.
#[derive(Debug, Clone)]
pub struct IssuedKey {
    /// The key itself (`ctx_ID_SECRET`); shown once, never stored.
    pub key: String,
    /// What the store keeps.
    pub record: ApiKeyRecord,
}

/// The SHA-256 of a key, in lowercase hex: what the store keeps and looks up.
pub fn hash_key(key: &str) -> String {
    sha256_hex(key.as_bytes())
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of `bytes` (on every request: one allocation, not one per byte).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer)?;
    Ok(hex(&buffer))
}

/// Why a key could not be made.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The tenant name is not valid.
    #[error("{0}")]
    Tenant(String),
    /// The operating system gave no randomness.
    #[error("no randomness for a key: {0}")]
    Random(getrandom::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Makes a key for `tenant` and stores its hash.
pub async fn issue_key<S: ApiKeyStore>(
    store: &S,
    tenant: &str,
    name: &str,
) -> Result<IssuedKey, IssueError> {
    let tenant = Tenant::new(tenant).map_err(|error| IssueError::Tenant(error.to_string()))?;
    let id = format!("ck_{}", random_hex(6).map_err(IssueError::Random)?);
    let secret = random_hex(24).map_err(IssueError::Random)?;
    let key = format!("ctx_{}_{secret}", &id[3..]);
    let record = store
        .create_api_key(&id, tenant.name(), name, &hash_key(&key))
        .await?;
    Ok(IssuedKey { key, record })
}

/// The key a request carries, if any.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.to_str().ok()?;
        return value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim);
    }
    headers.get("x-api-key")?.to_str().ok().map(str::trim)
}

/// The authenticated caller, put in the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant it acts for.
    pub tenant: Tenant,
    /// The key's public id (`anonymous` without a key).
    pub key_id: String,
}

/// Middleware: authenticates the request, applies the key's rate limit, and puts the
/// [`Caller`] in its extensions.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match presented_key(request.headers()) {
        Some(key) if !key.is_empty() => {
            let hash = hash_key(key);
            match state.key_cache.get(&hash, Instant::now()) {
                Some(caller) => caller,
                None => match state.store.api_key_by_hash(&hash).await {
                    Ok(Some(record)) => match Tenant::new(record.tenant) {
                        Ok(tenant) => {
                            let caller = Caller {
                                tenant,
                                key_id: record.id,
                            };
                            state.key_cache.put(hash, caller.clone(), Instant::now());
                            caller
                        }
                        Err(problem) => {
                            return ApiError::unauthorized(problem.to_string()).into_response();
                        }
                    },
                    Ok(None) => {
                        return ApiError::unauthorized("the API key is unknown or revoked")
                            .into_response();
                    }
                    Err(error) => return ApiError::store(&error).into_response(),
                },
            }
        }
        _ => match &state.anonymous {
            Some(tenant) => Caller {
                tenant: tenant.clone(),
                key_id: "anonymous".into(),
            },
            None => {
                return ApiError::unauthorized(
                    "an API key is required: `Authorization: Bearer KEY` (make one with `contexture keys create`)",
                )
                .into_response();
            }
        },
    };
    let admitted = match &state.redis_limits {
        Some(redis) => {
            state
                .rate_limiter
                .admit_shared(&caller.key_id, Some(redis), &state.metrics)
                .await
        }
        None => {
            state
                .rate_limiter
                .admit_shared(
                    &caller.key_id,
                    state.store.shared_rate_limits(),
                    &state.metrics,
                )
                .await
        }
    };
    if let Err(wait) = admitted {
        let mut response = ApiError {
            status: axum::http::StatusCode::TOO_MANY_REQUESTS,
            code: "rate_limited",
            message: format!(
                "rate limit of {} requests per second exceeded; retry after {} s",
                state.rate_limiter.rate,
                wait.as_secs().max(1)
            ),
            param: None,
        }
        .into_response();
        if let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Keys the store has verified lately, by hash, so that a busy client's requests do not
/// each cost a store query. Only known, unrevoked keys are kept (an unknown key is asked
/// for again every time, and cannot fill the cache), each for the configured time, after
/// which the store is asked again: that time bounds how long a revoked key still works.
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Caller, Instant)>>,
}

/// The most keys kept; past it the cache starts over (one store query per key to refill).
const KEY_CACHE_CAPACITY: usize = 10_000;

impl KeyCache {
    /// A cache keeping each verified key for `ttl` (zero: keeps nothing).
    pub fn new(ttl: Duration) -> KeyCache {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The caller of the key with this hash, verified less than the cache time before `now`.
    fn get(&self, hash: &str, now: Instant) -> Option<Caller> {
        if self.ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (caller, verified) = entries.get(hash)?;
        (now.saturating_duration_since(*verified) < self.ttl).then(|| caller.clone())
    }

    /// Notes that the store verified the key with this hash at `now`.
    fn put(&self, hash: String, caller: Caller, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= KEY_CACHE_CAPACITY && !entries.contains_key(&hash) {
            let ttl = self.ttl;
            entries.retain(|_, (_, verified)| now.saturating_duration_since(*verified) < ttl);
            if entries.len() >= KEY_CACHE_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(hash, (caller, now));
    }
}

/// One token bucket per key.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `rate` requests per second sustained, `burst` above it; a rate of 0 admits all.
    pub fn new(rate: f64, burst: u32) -> RateLimiter {
        RateLimiter {
            rate,
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token from `key`'s bucket, or says how long until one is there.
    pub fn admit(&self, key: &str) -> Result<(), Duration> {
        self.admit_at(key, Instant::now())
    }

    /// [`RateLimiter::admit`] from the bucket every server shares in `shared` (a Redis
    /// server, or a PostgreSQL database); from this server's own when there is none, or
    /// when it cannot answer (logged and counted in `metrics`: the shared one is back by a
    /// later request).
    pub async fn admit_shared(
        &self,
        key: &str,
        shared: Option<&impl RateLimitStore>,
        metrics: &Metrics,
    ) -> Result<(), Duration> {
        let Some(store) = shared.filter(|_| self.rate > 0.0) else {
            return self.admit(key);
        };
        let limit = RateLimit {
            per_second: self.rate,
            burst: self.burst as u32,
        };
        match store.take_rate_token(key, limit).await {
            Ok(admitted) => admitted,
            Err(error) => {
                tracing::warn!(%error, "cannot read the shared rate limit; using this server's own");
                metrics.count_shared_rate_limit_miss();
                self.admit(key)
            }
        }
    }

    fn admit_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_admits_its_burst_then_the_rate() {
        let limiter = RateLimiter::new(2.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter.admit_at("k", start).is_ok());
        }
        let wait = limiter.admit_at("k", start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another key has its own bucket.
        assert!(limiter.admit_at("other", start).is_ok());
        assert!(
            limiter
                .admit_at("k", start + Duration::from_millis(500))
                .is_ok()
        );
        assert!(
            limiter
                .admit_at("k", start + Duration::from_millis(500))
                .is_err()
        );
        assert!(RateLimiter::new(0.0, 1).admit_at("k", start).is_ok());
    }

    fn caller(key_id: &str) -> Caller {
        Caller {
            tenant: Tenant::new("acme".to_owned()).unwrap(),
            key_id: key_id.into(),
        }
    }

    #[test]
    fn a_verified_key_is_trusted_for_the_cache_time_only() {
        let cache = KeyCache::new(Duration::from_secs(5));
        let start = Instant::now();
        assert!(cache.get("h1", start).is_none());
        cache.put("h1".into(), caller("ck_1"), start);
        let hit = cache
            .get("h1", start + Duration::from_millis(4_999))
            .unwrap();
        assert_eq!(hit.key_id, "ck_1");
        assert!(cache.get("h1", start + Duration::from_secs(5)).is_none());
        assert!(cache.get("h2", start).is_none());
        // Verified again: trusted again from then on.
        cache.put("h1".into(), caller("ck_1"), start + Duration::from_secs(6));
        assert!(cache.get("h1", start + Duration::from_secs(10)).is_some());
    }

    #[test]
    fn a_zero_cache_time_keeps_nothing_and_the_cache_is_bounded() {
        let start = Instant::now();
        let off = KeyCache::new(Duration::ZERO);
        off.put("h".into(), caller("ck_1"), start);
        assert!(off.get("h", start).is_none());

        let cache = KeyCache::new(Duration::from_secs(5));
        for i in 0..KEY_CACHE_CAPACITY + 10 {
            cache.put(format!("h{i}"), caller("ck"), start);
        }
        let kept = cache.entries.lock().unwrap().len();
        assert!(kept <= KEY_CACHE_CAPACITY, "{kept} keys kept");
        // The newest key is always kept.
        let newest = format!("h{}", KEY_CACHE_CAPACITY + 9);
        assert!(cache.get(&newest, start).is_some());
    }

    #[test]
    fn keys_are_read_from_either_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented_key(&headers), None);
        headers.insert("x-api-key", HeaderValue::from_static("ctx_a_b"));
        assert_eq!(presented_key(&headers), Some("ctx_a_b"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer ctx_c_d"),
        );
        assert_eq!(presented_key(&headers), Some("ctx_c_d"));
        assert_eq!(hash_key("abc").len(), 64);
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
