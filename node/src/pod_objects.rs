//! The objects the agent's pods reference, read one by one as the Node
//! authorizer allows a node to (a node may get a Secret or ConfigMap only
//! while a pod bound to it names it, and may list neither), and the
//! service account tokens of their projected volumes.
//!
//! Secrets and ConfigMaps are read again when a pod's volumes or
//! containers are made and the copy is older than [`OBJECT_TTL`], as the
//! kubelet's `Cache` strategy does; a missing object is never remembered,
//! so one created after its pod is found on the next try. Tokens are
//! asked for bound to the pod (TokenRequest with `boundObjectRef`), and
//! asked for again once 80% of their life has passed or they are a day
//! old, as the kubelet's token manager does; a pod's tokens are dropped
//! with the pod.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccountTokenProjection};
use serde_json::json;
use skiff_api::pod_refs::{PodReferences, DEFAULT_SERVICE_ACCOUNT};
use skiff_client::runtime::api::Api;
use skiff_client::runtime::reflector::Store;
use skiff_client::Client;

use crate::agent::service_env;
use crate::pod::spec::pod_identity;
use crate::pod::PodResources;

/// How long a Secret or ConfigMap read is used before it is read again.
pub const OBJECT_TTL: Duration = Duration::from_secs(30);
/// A token's lifetime when the projection names none (Kubernetes' default).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// Tokens are refreshed at this age even if they live longer.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ObjectKey {
    Secret(String, String),
    ConfigMap(String, String),
}

#[derive(Clone)]
enum Object {
    Secret(Arc<Secret>),
    ConfigMap(Arc<ConfigMap>),
}

/// Which token of which pod: a pod may project several, for different
/// audiences and lifetimes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TokenKey {
    pod_uid: String,
    account: String,
    audience: String,
    seconds: i64,
}

/// A token as issued.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The JWT.
    pub token: String,
    /// When it was asked for (the agent's clock).
    pub issued: SystemTime,
    /// When it stops being accepted.
    pub expires: SystemTime,
}

impl Issued {
    /// Whether to ask for a new token at `now`: past 80% of its life, or a
    /// day old.
    pub fn needs_refresh(&self, now: SystemTime) -> bool {
        let life = self.expires.duration_since(self.issued).unwrap_or_default();
        let age = now.duration_since(self.issued).unwrap_or_default();
        age >= life.mul_f64(0.8) || age >= MAX_TOKEN_AGE
    }
}

/// The reads and tokens, for the pod workers.
pub struct PodObjects {
    client: Client,
    services: Store<Service>,
    objects: Mutex<HashMap<ObjectKey, (Object, std::time::Instant)>>,
    tokens: Mutex<HashMap<TokenKey, Issued>>,
}

impl PodObjects {
    /// Reads through `client`; Service variables come from `services`.
    pub fn new(client: Client, services: Store<Service>) -> PodObjects {
        PodObjects { client, services, objects: Mutex::default(), tokens: Mutex::default() }
    }

    fn fresh(&self, key: &ObjectKey) -> bool {
        let objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.get(key).is_some_and(|(_, read)| read.elapsed() < OBJECT_TTL)
    }

    fn cached(&self, key: &ObjectKey) -> Option<Object> {
        let objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.get(key).map(|(o, _)| o.clone())
    }

    fn keep(&self, key: ObjectKey, object: Option<Object>) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        match object {
            Some(o) => {
                objects.insert(key, (o, std::time::Instant::now()));
            }
            None => {
                objects.remove(&key);
            }
        }
    }

    /// Reads one object unless a fresh copy is held. A failed read keeps
    /// the old copy: a pod already running is not broken by an apiserver
    /// that is away for a moment.
    async fn read(&self, key: ObjectKey) {
        if self.fresh(&key) {
            return;
        }
        let read = match &key {
            ObjectKey::Secret(ns, name) => Api::<Secret>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|s| s.map(|s| Object::Secret(Arc::new(s)))),
            ObjectKey::ConfigMap(ns, name) => Api::<ConfigMap>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|c| c.map(|c| Object::ConfigMap(Arc::new(c)))),
        };
        match read {
            Ok(object) => self.keep(key, object),
            Err(e) => tracing::warn!(object = ?key, error = %e, "reading an object a pod references failed"),
        }
    }

    async fn token(&self, pod: &Pod, account: &str, source: &ServiceAccountTokenProjection) {
        let key = token_key(pod, account, source);
        let now = SystemTime::now();
        let due = {
            let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            tokens.get(&key).is_none_or(|t| t.needs_refresh(now))
        };
        if !due {
            return;
        }
        let (ns, name, uid) = pod_identity(pod);
        let audiences: Vec<&str> = source.audience.as_deref().filter(|a| !a.is_empty()).into_iter().collect();
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audiences,
                "expirationSeconds": key.seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        });
        let answer = match self.client.request_token(ns, account, &request).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(pod = %name, namespace = %ns, account, error = %e, "asking for a service account token failed");
                return;
            }
        };
        let Some(token) = answer["status"]["token"].as_str().filter(|t| !t.is_empty()) else {
            tracing::warn!(pod = %name, account, "a TokenRequest came back without a token");
            return;
        };
        let seconds = answer["spec"]["expirationSeconds"].as_i64().unwrap_or(key.seconds).max(1);
        let issued =
            Issued { token: token.to_string(), issued: now, expires: now + Duration::from_secs(seconds as u64) };
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(key, issued);
    }
}

fn token_key(pod: &Pod, account: &str, source: &ServiceAccountTokenProjection) -> TokenKey {
    TokenKey {
        pod_uid: pod_identity(pod).2.to_string(),
        account: account.to_string(),
        audience: source.audience.clone().unwrap_or_default(),
        seconds: source.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
    }
}

/// The account a pod runs as.
fn account_of(refs: &PodReferences) -> &str {
    if refs.service_account.is_empty() {
        DEFAULT_SERVICE_ACCOUNT
    } else {
        &refs.service_account
    }
}

/// Every serviceAccountToken source of the pod's projected volumes.
fn token_sources(pod: &Pod) -> impl Iterator<Item = &ServiceAccountTokenProjection> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
}

#[async_trait::async_trait]
impl PodResources for PodObjects {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        match self.cached(&ObjectKey::ConfigMap(namespace.into(), name.into()))? {
            Object::ConfigMap(c) => Some((*c).clone()),
            Object::Secret(_) => None,
        }
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        match self.cached(&ObjectKey::Secret(namespace.into(), name.into()))? {
            Object::Secret(s) => Some((*s).clone()),
            Object::ConfigMap(_) => None,
        }
    }

    fn service_env(&self, namespace: &str) -> Vec<(String, String)> {
        service_env(&self.services.list(), namespace)
    }

    async fn prepare(&self, pod: &Pod) {
        let refs = PodReferences::of(pod);
        let ns = pod_identity(pod).0.to_string();
        let reads = refs
            .secrets
            .iter()
            .map(|n| ObjectKey::Secret(ns.clone(), n.clone()))
            .chain(refs.config_maps.iter().map(|n| ObjectKey::ConfigMap(ns.clone(), n.clone())))
            .map(|key| self.read(key));
        futures::future::join_all(reads).await;
        let account = account_of(&refs);
        futures::future::join_all(token_sources(pod).map(|source| self.token(pod, account, source))).await;
    }

    fn service_account_token(&self, pod: &Pod, source: &ServiceAccountTokenProjection) -> Option<String> {
        let refs = PodReferences::of(pod);
        let key = token_key(pod, account_of(&refs), source);
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.get(&key).filter(|t| t.expires > SystemTime::now()).map(|t| t.token.clone())
    }

    fn forget(&self, pod: &Pod) {
        let uid = pod_identity(pod).2.to_string();
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| k.pod_uid != uid);
        // Copies no pod has read for a while go too.
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.retain(|_, (_, read)| read.elapsed() < OBJECT_TTL * 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_refreshed_at_four_fifths_of_its_life_or_at_a_day() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Issued { token: "t".into(), issued, expires: issued + Duration::from_secs(3600) };
        assert!(!hour.needs_refresh(issued));
        assert!(!hour.needs_refresh(issued + Duration::from_secs(2879)));
        assert!(hour.needs_refresh(issued + Duration::from_secs(2880)));
        let week = Issued { expires: issued + Duration::from_secs(7 * 24 * 3600), ..hour.clone() };
        assert!(!week.needs_refresh(issued + Duration::from_secs(23 * 3600)));
        assert!(week.needs_refresh(issued + Duration::from_secs(24 * 3600)));
        // A clock that went back does not make a token look new forever.
        assert!(!hour.needs_refresh(issued - Duration::from_secs(60)));
    }
}
