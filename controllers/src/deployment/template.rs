//! The pod template as the identity of a ReplicaSet: its hash (the
//! `pod-template-hash` label and name suffix), template equality that
//! ignores that label, and revision annotations.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

/// The label that tells one ReplicaSet's pods from another's.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The rollout revision of a ReplicaSet (and of its Deployment).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// `spec.replicas` of the Deployment when it last scaled this ReplicaSet.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas + maxSurge` of the Deployment when it last scaled this
/// ReplicaSet; proportional scaling reads it.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";

/// Characters that never spell words nor look alike, as Kubernetes'
/// `rand.SafeEncodeString` uses.
const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A stable hash of `template` (and the collision count, so a collision
/// is escaped by counting up): FNV-1a over the template's JSON, rendered in
/// safe characters.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let json = serde_json::to_string(template).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(json.as_bytes());
    if let Some(count) = collision_count {
        feed(&count.to_le_bytes());
    }
    let mut out = Vec::new();
    loop {
        out.push(SAFE[(hash % SAFE.len() as u32) as usize]);
        hash /= SAFE.len() as u32;
        if hash == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The template as JSON without the hash label, for comparison.
fn without_hash(template: Option<&PodTemplateSpec>) -> Value {
    let mut v = template.and_then(|t| serde_json::to_value(t).ok()).unwrap_or(Value::Null);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.remove(POD_TEMPLATE_HASH);
            if labels.is_empty() {
                meta.remove("labels");
            }
        }
    }
    drop_empty(&mut v);
    v
}

/// Removes empty objects and lists, recursively: `resources: {}` (which
/// `kubectl rollout undo` sends back) means what an absent field means,
/// as Kubernetes' semantic equality of the typed templates has it.
fn drop_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.values_mut().for_each(drop_empty);
            map.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// Whether two templates are the same but for the hash label (Kubernetes'
/// `EqualIgnoreHash`).
pub fn equal_ignoring_hash(a: Option<&PodTemplateSpec>, b: Option<&PodTemplateSpec>) -> bool {
    without_hash(a) == without_hash(b)
}

/// The revision annotation of a ReplicaSet; 0 if missing or malformed.
pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(rs, REVISION).and_then(|r| r.parse().ok()).unwrap_or(0)
}

pub fn annotation<'a>(rs: &'a ReplicaSet, key: &str) -> Option<&'a str> {
    rs.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicaset::tests::template;

    #[test]
    fn the_hash_is_stable_safe_and_moves_with_the_template_and_collision_count() {
        let t = template("web", "nginx:1");
        let h = pod_template_hash(&t, None);
        assert_eq!(h, pod_template_hash(&t.clone(), None));
        assert!(!h.is_empty() && h.len() <= 7);
        assert!(h.bytes().all(|b| SAFE.contains(&b)), "{h}");
        assert_ne!(h, pod_template_hash(&template("web", "nginx:2"), None));
        assert_ne!(h, pod_template_hash(&t, Some(1)));
    }

    #[test]
    fn an_empty_field_equals_an_absent_one_as_after_a_rollout_undo() {
        let t = template("web", "nginx:1");
        let mut undone = serde_json::to_value(&t).unwrap();
        undone["spec"]["containers"][0]["resources"] = serde_json::json!({});
        let undone: PodTemplateSpec = serde_json::from_value(undone).unwrap();
        assert!(equal_ignoring_hash(Some(&t), Some(&undone)));
    }

    #[test]
    fn templates_differing_only_in_the_hash_label_are_equal() {
        let t = template("web", "nginx:1");
        let mut hashed = t.clone();
        hashed.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert(POD_TEMPLATE_HASH.into(), "abc".into());
        assert!(equal_ignoring_hash(Some(&t), Some(&hashed)));
        assert!(!equal_ignoring_hash(Some(&t), Some(&template("web", "nginx:2"))));
    }
}
