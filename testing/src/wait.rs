//! Bounded polls: the one way a test waits for something that becomes true
//! in its own time (a leader, a caught-up member). The limits are generous,
//! for slow and shared machines; a poll returns as soon as it succeeds, and
//! nothing asserts how fast that was.

use std::future::Future;
use std::time::Duration;

/// How often [`must_eventually`] tries again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Calls `attempt` every 50 ms until it returns `Ok`, and returns that
/// value; panics naming `what` and the last attempt's error if none
/// succeeded within `within`.
pub async fn must_eventually<T, E, F, Fut>(what: &str, within: Duration, mut attempt: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match attempt().await {
            Ok(value) => return value,
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not within {within:?}; last attempt: {last:?}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_poll_returns_the_first_success() {
        let attempts = &AtomicU32::new(0);
        let value = must_eventually("the third attempt", Duration::from_secs(10), || async move {
            match attempts.fetch_add(1, Ordering::SeqCst) {
                n @ 0..=1 => Err(n),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!((value, attempts.load(Ordering::SeqCst)), (2, 3));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "never: not within 1s; last attempt: \"still no\"")]
    async fn a_poll_that_never_succeeds_panics_with_the_last_error() {
        must_eventually("never", Duration::from_secs(1), || async { Err::<(), _>("still no") }).await;
    }
}
