//! ResourceQuota admission: a create in a namespace with quotas is charged
//! against each quota that tracks it, and refused (403, Kubernetes'
//! `exceeded quota` message) if any would go over `spec.hard`.
//!
//! The charge is exact under concurrency: the raised `status.used` is
//! written in the same store transaction as the new object, compared on
//! the quota's mod revision, so of two creates racing for the last unit
//! one commits and the other is charged again against the new usage (and
//! refused). Usage goes down only when the ResourceQuota controller
//! recounts (deletes are not refunded here, as in Kubernetes), and a quota
//! whose `used` is not known yet refuses what it tracks until it is.
//! Which keys track what, and which pods a scoped quota selects, is
//! `skiff_api::quota`'s, shared with the controller.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use serde_json::{json, Value};
use skiff_api::quota::{is_scoped, is_terminal, pod_amount, selects, Key, Side};
use skiff_api::resources::{self, Kind};
use skiff_api::validation::quantity::Quantity;
use skiff_api::{ApiError, Reason};

use crate::admission::{forbidden, Attributes};
use crate::storage::{prefix_end, Consistency, ObjectStore};

/// A quota a create raises: written with the object, if the quota is
/// still at `mod_revision`.
pub(crate) struct Charge {
    pub key: String,
    pub mod_revision: i64,
    pub quota: Value,
}

/// Charges `obj`, about to be created, to its namespace's quotas, read at
/// revision `at_least` or later (the revision a previous attempt failed
/// at, so a retry sees the quota that beat it).
///
/// The quotas are read from what this member has applied, which may lag
/// the leader: an admission charged against a stale quota only fails its
/// compare and is charged again, but a refusal would be final. So a
/// refusal is confirmed by a linearizable read before it is returned: a
/// follower that has not yet applied the controller's first count, or a
/// recount that lowered `used`, does not refuse what the quota allows.
pub(crate) async fn charge(
    objects: &ObjectStore,
    attrs: &Attributes<'_>,
    obj: &Value,
    at_least: i64,
) -> Result<Vec<Charge>, ApiError> {
    if attrs.verb != "create" || !attrs.subresource.is_empty() || !attrs.resource.namespaced {
        return Ok(Vec::new());
    }
    let consistency = if at_least > 0 { Consistency::AtLeast(at_least) } else { Consistency::Any };
    match charge_at(objects, attrs, obj, consistency).await {
        Err(e) if e.reason == Reason::Forbidden => confirm(objects, attrs, obj).await,
        charged => charged,
    }
}

/// How long a refusal's confirming read waits for a leader.
const CONFIRM_WAIT: Duration = Duration::from_secs(5);

/// Charges `obj` against a linearizable read of the quotas. That read
/// needs the leader: during an election it waits for the next one (up
/// to [`CONFIRM_WAIT`]), as the create's own write would, rather than
/// answer 503 where the refusal it confirms would have been the answer.
async fn confirm(objects: &ObjectStore, attrs: &Attributes<'_>, obj: &Value) -> Result<Vec<Charge>, ApiError> {
    let deadline = tokio::time::Instant::now() + CONFIRM_WAIT;
    let mut backoff = Duration::from_millis(50);
    loop {
        match charge_at(objects, attrs, obj, Consistency::Linearizable).await {
            Err(e) if e.reason == Reason::ServiceUnavailable && tokio::time::Instant::now() + backoff < deadline => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            charged => return charged,
        }
    }
}

async fn charge_at(
    objects: &ObjectStore,
    attrs: &Attributes<'_>,
    obj: &Value,
    consistency: Consistency,
) -> Result<Vec<Charge>, ApiError> {
    let revision = objects.prepare_read(consistency).await?;
    let prefix = resources::of(Kind::ResourceQuota).namespace_prefix(Some(attrs.namespace));
    let page = objects.range_small(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), revision)?;
    if page.items.is_empty() {
        return Ok(Vec::new());
    }
    let pod: Option<Pod> = match attrs.resource.kind_id {
        Kind::Pod => Some(serde_json::from_value(obj.clone()).map_err(|e| ApiError::bad_request(e.to_string()))?),
        _ => None,
    };
    let mut charges = Vec::new();
    for stored in &page.items {
        let quota = stored.decode()?;
        if let Some(raised) = raise(attrs, &quota, pod.as_ref())? {
            let key = String::from_utf8_lossy(&stored.key).into_owned();
            charges.push(Charge { key, mod_revision: stored.mod_revision, quota: raised });
        }
    }
    Ok(charges)
}

/// `quota` with the object's usage added to `status.used`; `None` if it
/// does not track the object; an error if it would go over.
fn raise(attrs: &Attributes<'_>, quota: &Value, pod: Option<&Pod>) -> Result<Option<Value>, ApiError> {
    let typed: ResourceQuota = serde_json::from_value(quota.clone())
        .map_err(|e| ApiError::internal(format!("a stored ResourceQuota does not decode: {e}")))?;
    if typed.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let spec = typed.spec.clone().unwrap_or_default();
    match pod {
        Some(pod) if is_terminal(pod) || !selects(&spec, pod) => return Ok(None),
        None if is_scoped(&spec) => return Ok(None),
        _ => {}
    }
    let hard = spec.hard.unwrap_or_default();
    let qualified = attrs.resource.qualified();
    // Key -> (amount, written in binary form).
    let mut requested: BTreeMap<String, (Quantity, bool)> = BTreeMap::new();
    for key in hard.keys() {
        let amount = match (Key::parse(key), pod) {
            (Key::Count(resource), _) if resource == qualified => Some((Quantity::parse("1").expect("1"), false)),
            (Key::Requests(name), Some(pod)) => pod_amount(pod, &name, Side::Requests),
            (Key::Limits(name), Some(pod)) => pod_amount(pod, &name, Side::Limits),
            _ => None,
        };
        if let Some(amount) = amount.filter(|(q, _)| !q.is_zero()) {
            requested.insert(key.clone(), amount);
        }
    }
    if requested.is_empty() {
        return Ok(None);
    }
    let name = typed.metadata.name.as_deref().unwrap_or_default();
    let used = typed.status.as_ref().and_then(|s| s.used.clone()).unwrap_or_default();
    let unknown: Vec<&str> = requested.keys().filter(|k| !used.contains_key(*k)).map(String::as_str).collect();
    if !unknown.is_empty() {
        return Err(forbidden(attrs, &format!("status unknown for quota: {name}, resources: {}", unknown.join(","))));
    }
    let mut raised = BTreeMap::new();
    let mut over = Vec::new();
    for (key, (amount, binary)) in &requested {
        let parse =
            |q: &str| Quantity::parse(q).ok_or_else(|| ApiError::internal(format!("quota {name}: bad quantity {q:?}")));
        let limit = parse(&hard[key].0)?;
        let before = parse(&used[key].0)?;
        let after =
            before.checked_add(amount).ok_or_else(|| ApiError::internal(format!("quota {name}: {key} overflows")))?;
        if after.compare(&limit) == std::cmp::Ordering::Greater {
            over.push(key.as_str());
        }
        let binary = *binary || Quantity::is_binary_form(&used[key].0) || Quantity::is_binary_form(&hard[key].0);
        raised.insert(key.clone(), (amount.format(binary), after.format(binary)));
    }
    if !over.is_empty() {
        let list =
            |f: &dyn Fn(&str) -> String| over.iter().map(|k| format!("{k}={}", f(k))).collect::<Vec<_>>().join(",");
        return Err(forbidden(
            attrs,
            &format!(
                "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
                list(&|k| raised[k].0.clone()),
                list(&|k| used[k].0.clone()),
                list(&|k| hard[k].0.clone()),
            ),
        ));
    }
    let mut out = quota.clone();
    if !out["status"].is_object() {
        out["status"] = json!({});
    }
    if !out["status"]["used"].is_object() {
        out["status"]["used"] = json!({});
    }
    for (key, (_, after)) in raised {
        out["status"]["used"][key] = json!(after);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::UserInfo;

    fn quota(hard: Value, used: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team"},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": used}})
    }

    fn attempt(kind: Kind, quota: &Value, obj: &Value) -> Result<Option<Value>, String> {
        let user = UserInfo { name: "alice".into(), groups: vec![] };
        let attrs = Attributes {
            user: &user,
            verb: "create",
            resource: resources::of(kind),
            subresource: "",
            namespace: "team",
            name: "x",
        };
        let pod: Option<Pod> = (kind == Kind::Pod).then(|| serde_json::from_value(obj.clone()).unwrap());
        raise(&attrs, quota, pod.as_ref()).map_err(|e| e.to_string())
    }

    fn pod(cpu: &str, memory: &str) -> Value {
        json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}}]}})
    }

    #[test]
    fn a_create_raises_used_by_its_count_and_its_requests() {
        let q = quota(
            json!({"pods": "3", "requests.cpu": "2", "limits.memory": "1Gi", "configmaps": "1"}),
            json!({"pods": "1", "requests.cpu": "500m", "limits.memory": "256Mi", "configmaps": "0"}),
        );
        let raised = attempt(Kind::Pod, &q, &pod("1", "256Mi")).unwrap().unwrap();
        assert_eq!(
            raised["status"]["used"],
            json!({"pods": "2", "requests.cpu": "1500m", "limits.memory": "512Mi", "configmaps": "0"})
        );
        let raised = attempt(Kind::ConfigMap, &q, &json!({"metadata": {"name": "x"}})).unwrap().unwrap();
        assert_eq!(raised["status"]["used"]["configmaps"], "1");
        assert_eq!(raised["status"]["used"]["pods"], "1");
        // A Secret is not tracked by this quota.
        assert!(attempt(Kind::Secret, &q, &json!({"metadata": {"name": "x"}})).unwrap().is_none());
    }

    #[test]
    fn going_over_is_refused_with_what_was_requested_used_and_limited() {
        let q = quota(json!({"pods": "2", "requests.cpu": "1"}), json!({"pods": "1", "requests.cpu": "800m"}));
        let err = attempt(Kind::Pod, &q, &pod("500m", "1Mi")).unwrap_err();
        assert!(
            err.ends_with("is forbidden: exceeded quota: q, requested: requests.cpu=500m, used: requests.cpu=800m, limited: requests.cpu=1"),
            "{err}"
        );
        let full = quota(json!({"pods": "1"}), json!({"pods": "1"}));
        let err = attempt(Kind::Pod, &full, &pod("1", "1Mi")).unwrap_err();
        assert!(err.contains("exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1"), "{err}");
    }

    #[test]
    fn an_unknown_usage_refuses_until_the_controller_has_counted() {
        let q = json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "5"}}});
        let err = attempt(Kind::Pod, &q, &pod("1", "1Mi")).unwrap_err();
        assert!(err.contains("status unknown for quota: q, resources: pods"), "{err}");
    }

    #[test]
    fn scoped_quotas_charge_only_the_pods_they_select() {
        let mut q = quota(json!({"pods": "1", "configmaps": "0"}), json!({"pods": "0", "configmaps": "0"}));
        q["spec"]["scopes"] = json!(["BestEffort"]);
        assert!(attempt(Kind::Pod, &q, &pod("1", "1Mi")).unwrap().is_none(), "not best effort");
        let best_effort = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert_eq!(attempt(Kind::Pod, &q, &best_effort).unwrap().unwrap()["status"]["used"]["pods"], "1");
        assert!(attempt(Kind::ConfigMap, &q, &json!({"metadata": {"name": "x"}})).unwrap().is_none());
    }
}
