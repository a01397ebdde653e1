//! Fairness between users, in the spirit of Kubernetes' API Priority and
//! Fairness: each user may have at most `per_user` requests in flight on
//! a member; more wait up to `queue_wait` for one of theirs to finish, and
//! are then refused with 429 and `Retry-After`, as kube-apiserver refuses
//! them. A client flooding the API fills only its own share, so everyone
//! else keeps being served.
//!
//! Exempt, as Kubernetes exempts them: `system:masters` (the controllers
//! and operators that must get through to fix things), long-running
//! requests (watches, logs, exec, port-forward, which would otherwise
//! hold a share for hours) and paths outside the resource API (probes,
//! discovery, metrics).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use skiff_api::status::Details;
use skiff_api::ApiError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::UserInfo;
use crate::rbac::bootstrap::MASTERS;
use crate::request_info::RequestInfo;

/// Users whose requests are idle are forgotten once there are this many.
const FORGET_AFTER: usize = 1024;

/// `--max-requests-inflight-per-user` and how long an over-limit request
/// waits for a share before 429.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub per_user: usize,
    pub queue_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { per_user: 64, queue_wait: Duration::from_secs(1) }
    }
}

pub struct Fairness {
    limits: Limits,
    users: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Fairness {
    pub fn new(limits: Limits) -> Fairness {
        Fairness { limits, users: Mutex::new(HashMap::new()) }
    }

    /// A share for one request of `user`, or `None` if their shares
    /// stayed taken for the whole queue wait.
    pub async fn admit(&self, user: &str) -> Option<OwnedSemaphorePermit> {
        let semaphore = {
            let mut users = self.users.lock().expect("fairness lock poisoned");
            if users.len() >= FORGET_AFTER {
                let per_user = self.limits.per_user;
                users.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < per_user);
            }
            users.entry(user.to_string()).or_insert_with(|| Arc::new(Semaphore::new(self.limits.per_user))).clone()
        };
        tokio::time::timeout(self.limits.queue_wait, semaphore.acquire_owned()).await.ok()?.ok()
    }
}

/// The HTTP layer: holds a share of the request's user while it runs.
pub async fn limit(State(fairness): State<Arc<Fairness>>, request: Request, next: Next) -> Response {
    let exempt = request.extensions().get::<RequestInfo>().is_none_or(|i| !i.is_resource || i.is_long_running())
        || request.extensions().get::<UserInfo>().is_none_or(|u| u.groups.iter().any(|g| g == MASTERS));
    if exempt {
        return next.run(request).await;
    }
    let user = request.extensions().get::<UserInfo>().map(|u| u.name.clone()).unwrap_or_default();
    match fairness.admit(&user).await {
        Some(_share) => next.run(request).await,
        None => {
            crate::metrics::rejected(&user);
            let mut e = ApiError::too_many_requests("Too many requests, please try again later.");
            e.details = Some(Box::new(Details { retry_after_seconds: Some(1), ..Default::default() }));
            let mut response = crate::rest::error_response(&e);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_flooding_user_fills_only_their_own_share() {
        let fairness = Fairness::new(Limits { per_user: 2, queue_wait: Duration::from_millis(50) });
        let a1 = fairness.admit("flood").await.expect("first share");
        let _a2 = fairness.admit("flood").await.expect("second share");
        assert!(fairness.admit("flood").await.is_none(), "a third request in flight got a share");
        // Someone else is served at once.
        let _b = fairness.admit("quiet").await.expect("another user's share");
        // A request waiting in the queue gets the share freed while it waits.
        let waiting = tokio::spawn({
            let fairness = Arc::new(fairness);
            async move { fairness.admit("flood").await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(a1);
        assert!(waiting.await.unwrap());
    }
}
