//! How a component reaches the apiservers: kubeconfig-shaped connection
//! settings ([`ClientConfig`]) and the client-side rate limiter
//! ([`TokenBucket`]) that paces its writes, as client-go's `rest.Config`
//! with its `QPS` and `Burst`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use skiff_pki::ClientFiles;

use crate::resources::{Client, ClientError};

/// The connection settings every component (controller manager, scheduler,
/// node agent, skiffctl) takes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientConfig {
    /// The apiservers' client addresses (`HOST:PORT` or URLs); requests fail
    /// over between them.
    pub endpoints: Vec<String>,
    /// TLS to the apiservers: the CA their certificates chain to, and the
    /// client certificate that says who this client is; `None`: plaintext.
    pub tls: Option<ClientFiles>,
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

/// The flags a component or tool reaches the apiservers' client port over
/// TLS with, kubectl's names: the CA to trust, and the certificate that
/// says who it is.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClientTlsArgs {
    /// Reach the apiservers over TLS, trusting this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub certificate_authority: Option<PathBuf>,
    /// The client certificate to present (PEM; its common name is the user,
    /// its organization the group).
    #[arg(long, value_name = "FILE", requires_all = ["certificate_authority", "client_key"])]
    pub client_certificate: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "client_certificate")]
    pub client_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// What the flags ask for; `None`: plaintext.
    pub fn files(&self) -> Option<ClientFiles> {
        let ca = self.certificate_authority.clone()?;
        let cert = self.client_certificate.clone().zip(self.client_key.clone());
        Some(ClientFiles { ca, cert })
    }
}

impl Client {
    /// A client built from `config`: its endpoints, its TLS and its write
    /// rate limit. Unreadable certificate files fail here, not at the first
    /// request.
    pub fn from_config(config: &ClientConfig) -> Result<Client, ClientError> {
        let tls = match &config.tls {
            Some(files) => {
                let tls = skiff_pki::transport::client_config(files)
                    .map_err(|e| ClientError::Unreachable(format!("TLS to the apiservers: {e}")))?;
                Some(skiff_pki::Connector::new(Arc::new(tls)))
            }
            None => None,
        };
        Client::connect(&config.endpoints, config.write_limiter(), tls)
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
