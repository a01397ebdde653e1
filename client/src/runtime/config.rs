//! How a component reaches the apiservers: kubeconfig-shaped connection
//! settings ([`ClientConfig`]) and the client-side rate limiter
//! ([`TokenBucket`]) that paces its writes, as client-go's `rest.Config`
//! with its `QPS` and `Burst`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};

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
    /// A bearer token to send with every request (sent only over TLS);
    /// `None`: the client certificate, if any, says who this client is.
    pub token: Option<TokenSource>,
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

/// Where a client's bearer token comes from (kubeconfig's `token` and
/// `tokenFile`).
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// This token, for the client's whole life.
    Static(String),
    /// The file's contents, read again every [`TOKEN_FILE_REREAD`]: a
    /// projected service account token is rewritten before it expires.
    File(PathBuf),
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Never the token itself: configs end up in logs.
            TokenSource::Static(_) => f.write_str("Static(<redacted>)"),
            TokenSource::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// How long a token read from a file is used before the file is read
/// again (client-go's cached file token source waits a minute too).
pub const TOKEN_FILE_REREAD: std::time::Duration = std::time::Duration::from_secs(60);

/// A bearer token as the `authorization` header every request carries.
pub(crate) struct BearerToken {
    source: TokenSource,
    /// The header last made, and when (for a file, when it was read).
    cached: Mutex<Option<(MetadataValue<Ascii>, std::time::Instant)>>,
}

impl BearerToken {
    pub(crate) fn new(source: TokenSource) -> BearerToken {
        BearerToken { source, cached: Mutex::new(None) }
    }

    /// `Bearer <token>`. A file that cannot be read again keeps the last
    /// token it gave (the server says when that one has expired); one never
    /// read is an error.
    pub(crate) fn header(&self) -> Result<MetadataValue<Ascii>, String> {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((header, read)) = &*cached {
            if matches!(self.source, TokenSource::Static(_)) || read.elapsed() < TOKEN_FILE_REREAD {
                return Ok(header.clone());
            }
        }
        let token = match &self.source {
            TokenSource::Static(token) => Ok(token.trim().to_string()),
            TokenSource::File(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| format!("reading the token file {}: {e}", path.display())),
        };
        let header = token.and_then(|token| {
            if token.is_empty() {
                return Err("the bearer token is empty".to_string());
            }
            MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| "the bearer token holds characters a header cannot".to_string())
        });
        match (header, &*cached) {
            (Ok(header), _) => {
                *cached = Some((header.clone(), std::time::Instant::now()));
                Ok(header)
            }
            (Err(e), Some((old, _))) => {
                tracing::warn!(error = %e, "keeping the bearer token read before");
                Ok(old.clone())
            }
            (Err(e), None) => Err(e),
        }
    }
}

/// The flags a component or tool reaches the apiservers' client port over
/// TLS with, kubectl's names: the CA to trust, and the certificate or
/// bearer token that says who it is.
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
    /// Say who this client is with the bearer token in this file instead
    /// (a service account token, or one of the apiserver's
    /// --token-auth-file); the file is read again every minute, so a
    /// projected token that is rewritten keeps working.
    #[arg(long, value_name = "FILE", requires = "certificate_authority", conflicts_with = "client_certificate")]
    pub token_file: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// What the flags ask for; `None`: plaintext.
    pub fn files(&self) -> Option<ClientFiles> {
        let ca = self.certificate_authority.clone()?;
        let cert = self.client_certificate.clone().zip(self.client_key.clone());
        Some(ClientFiles { ca, cert })
    }

    /// The bearer token the flags name, if any.
    pub fn token(&self) -> Option<TokenSource> {
        self.token_file.clone().map(TokenSource::File)
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
        let token = match &config.token {
            // A bearer token in plaintext is anyone's who can see the wire.
            Some(_) if tls.is_none() => {
                return Err(ClientError::Unreachable(
                    "a bearer token is sent only over TLS: give the CA to trust (--certificate-authority)".into(),
                ))
            }
            Some(source) => Some(Arc::new(BearerToken::new(source.clone()))),
            None => None,
        };
        Client::connect_as(&config.endpoints, config.write_limiter(), tls, token)
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

    #[test]
    fn a_token_file_is_read_again_after_a_minute_and_kept_when_unreadable() {
        let dir = std::env::temp_dir().join(format!("skiff-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = BearerToken::new(TokenSource::File(path.clone()));
        assert_eq!(token.header().unwrap(), "Bearer first");

        // Rewritten (as the node agent rewrites a projected token): the old
        // one is used until a minute has passed.
        std::fs::write(&path, "second").unwrap();
        assert_eq!(token.header().unwrap(), "Bearer first");
        let age = |token: &BearerToken| {
            let mut cached = token.cached.lock().unwrap();
            let (header, _) = cached.take().unwrap();
            *cached = Some((header, std::time::Instant::now() - TOKEN_FILE_REREAD));
        };
        age(&token);
        assert_eq!(token.header().unwrap(), "Bearer second");

        // Gone: the last token read stays in use.
        std::fs::remove_file(&path).unwrap();
        age(&token);
        assert_eq!(token.header().unwrap(), "Bearer second");
        let never_read = BearerToken::new(TokenSource::File(path.clone()));
        assert!(never_read.header().unwrap_err().starts_with("reading the token file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_is_never_printed_nor_sent_empty_or_broken() {
        let source = TokenSource::Static("s3cret".into());
        assert!(!format!("{source:?}").contains("s3cret"));
        assert_eq!(BearerToken::new(source).header().unwrap(), "Bearer s3cret");
        assert!(BearerToken::new(TokenSource::Static(" ".into())).header().is_err());
        assert!(BearerToken::new(TokenSource::Static("a\nb".into())).header().is_err());
    }

    #[tokio::test]
    async fn a_token_needs_tls() {
        let config =
            ClientConfig { token: Some(TokenSource::Static("t".into())), ..ClientConfig::new(&["127.0.0.1:1"]) };
        let Err(e) = Client::from_config(&config) else { panic!("a plaintext token was accepted") };
        assert!(e.to_string().contains("only over TLS"), "{e}");
    }

    #[tokio::test]
    async fn from_config_uses_the_endpoints() {
        let config = ClientConfig { qps: 5.0, burst: 10, ..ClientConfig::new(&["127.0.0.1:1", "127.0.0.1:2"]) };
        assert!(Client::from_config(&config).is_ok());
        assert!(Client::from_config(&ClientConfig::default()).is_err());
    }
}
