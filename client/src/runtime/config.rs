//! How a component reaches the apiservers: kubeconfig-shaped connection
//! settings ([`ClientConfig`]) and the client-side rate limiter
//! ([`TokenBucket`]) that paces its writes, as client-go's `rest.Config`
//! with its `QPS` and `Burst`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::resources::{Client, ClientError};

/// The connection settings every component (controller manager, scheduler,
/// node agent, skiffctl) takes.
///
/// Security is not on yet: the CA, client certificate, key and bearer token
/// are carried so command lines and config files keep their final shape,
/// but [`Client::from_config`] does not use them (connections are plaintext
/// gRPC and unauthenticated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientConfig {
    /// The apiservers' client addresses (`HOST:PORT` or URLs); requests fail
    /// over between them.
    pub endpoints: Vec<String>,
    /// The cluster CA that signs the apiservers' certificates (unused yet).
    pub ca_file: Option<PathBuf>,
    /// The client certificate presented to the apiservers (unused yet).
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (unused yet).
    pub client_key_file: Option<PathBuf>,
    /// A bearer token sent with every request (unused yet).
    pub bearer_token: Option<String>,
    /// Writes per second allowed on average; 0: unlimited.
    pub qps: f64,
    /// Writes allowed in a burst above `qps` (at least 1 when `qps` > 0).
    pub burst: u32,
}

impl ClientConfig {
    /// Settings for `endpoints` with no credentials and no rate limit.
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> ClientConfig {
        ClientConfig { endpoints: endpoints.iter().map(|e| e.as_ref().to_string()).collect(), ..Default::default() }
    }

    /// The write limiter these settings ask for (`None` when `qps` is 0).
    pub fn write_limiter(&self) -> Option<TokenBucket> {
        TokenBucket::new(self.qps, self.burst)
    }
}

impl Client {
    /// A client built from `config`: its endpoints and its write rate limit.
    /// The TLS and credential fields are not used yet (see [`ClientConfig`]).
    pub fn from_config(config: &ClientConfig) -> Result<Client, ClientError> {
        Client::with_write_limiter(&config.endpoints, config.write_limiter())
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second. A caller
/// that finds it empty reserves the next token and sleeps until it is due,
/// so waiters are served in the order they asked.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens left (negative: reserved ahead by waiters) and when the count
    /// was last brought up to date.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket; `None` when `qps` is 0 or less (unlimited).
    pub fn new(qps: f64, burst: u32) -> Option<TokenBucket> {
        if qps.is_nan() || qps <= 0.0 {
            return None;
        }
        let burst = f64::from(burst.max(1));
        Some(TokenBucket { qps, burst, state: Mutex::new((burst, Instant::now())) })
    }

    /// Takes a token now and returns how long the caller must wait before
    /// using it (zero when one was available).
    pub fn reserve(&self) -> Duration {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = *state;
        let tokens = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst) - 1.0;
        *state = (tokens, now);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.qps)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_qps_means_no_limiter() {
        assert!(TokenBucket::new(0.0, 10).is_none());
        assert!(ClientConfig::new(&["a:1"]).write_limiter().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_lets_a_burst_through_then_paces_at_qps() {
        let bucket = TokenBucket::new(10.0, 3).unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            bucket.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..5 {
            bucket.acquire().await;
        }
        // Five more tokens at 10 per second.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(499) && elapsed <= Duration::from_millis(501), "{elapsed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_refills_while_idle_but_never_above_burst() {
        let bucket = TokenBucket::new(1.0, 2).unwrap();
        bucket.acquire().await;
        bucket.acquire().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::ZERO);
        assert_eq!(bucket.reserve(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn from_config_uses_the_endpoints() {
        let config = ClientConfig { qps: 5.0, burst: 10, ..ClientConfig::new(&["127.0.0.1:1", "127.0.0.1:2"]) };
        assert!(Client::from_config(&config).is_ok());
        assert!(Client::from_config(&ClientConfig::default()).is_err());
    }
}
