//! The root CA publisher, as Kubernetes' `root-ca-cert-publisher`: every
//! active namespace has a ConfigMap `kube-root-ca.crt` whose `ca.crt` is
//! the cluster's CA, so that a pod's service account volume carries what
//! it needs to trust the apiserver. It is written again if someone deletes
//! or edits it, and after the CA changes.
//!
//! The wiring calls [`reconcile`] for a namespace (on its events and on
//! any change to a `kube-root-ca.crt`) with that namespace's ConfigMap
//! from its cache.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;

use crate::action::Action;

/// The ConfigMap's name in every namespace.
pub const NAME: &str = "kube-root-ca.crt";
/// Its one key.
pub const KEY: &str = "ca.crt";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal \
                           endpoints such as the internal service IP or kubernetes.default.svc. No other usage is \
                           guaranteed across distributions of Kubernetes clusters.";

/// Creates or corrects `kube-root-ca.crt` in `namespace` to hold `ca` (PEM);
/// nothing in a namespace that is going away.
pub fn reconcile(namespace: &Namespace, existing: Option<&ConfigMap>, ca: &str) -> Vec<Action> {
    let Some(ns) = namespace.metadata.name.as_deref() else { return vec![] };
    let terminating = namespace.metadata.deletion_timestamp.is_some()
        || namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    if terminating {
        return vec![];
    }
    let wanted = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": ns, "annotations": {"kubernetes.io/description": DESCRIPTION}},
        "data": {KEY: ca},
    });
    let Some(existing) = existing else { return vec![Action::Create(wanted)] };
    let data = existing.data.as_ref();
    let only_the_ca = data.is_some_and(|d| d.len() == 1 && d.get(KEY).map(String::as_str) == Some(ca));
    if only_the_ca && existing.binary_data.as_ref().is_none_or(|b| b.is_empty()) {
        return vec![];
    }
    // Replaced whole, with the cached resourceVersion: a stale cache ends
    // in a conflict and a requeue, never in overwriting a newer edit blindly.
    let mut updated = wanted;
    updated["metadata"]["resourceVersion"] = json!(existing.metadata.resource_version);
    if let (Some(kept), Some(annotations)) =
        (&existing.metadata.annotations, updated["metadata"]["annotations"].as_object_mut())
    {
        for (k, v) in kept {
            annotations.entry(k.clone()).or_insert(json!(v));
        }
    }
    vec![Action::Update(updated)]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn namespace(name: &str) -> Namespace {
        Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn config_map(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(NAME.into()),
                namespace: Some("team".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()),
            ..Default::default()
        }
    }

    #[test]
    fn a_namespace_without_it_gets_the_ca() {
        let actions = reconcile(&namespace("team"), None, CA);
        let [Action::Create(created)] = actions.as_slice() else { panic!("{actions:?}") };
        assert_eq!(created["metadata"]["namespace"], "team");
        assert_eq!(created["metadata"]["name"], NAME);
        assert_eq!(created["data"], json!({KEY: CA}));
    }

    #[test]
    fn a_current_one_is_left_and_an_edited_or_stale_one_is_put_back() {
        assert!(reconcile(&namespace("team"), Some(&config_map(&[(KEY, CA)])), CA).is_empty());
        for data in [&[(KEY, "old")][..], &[(KEY, CA), ("extra", "x")][..], &[][..]] {
            let actions = reconcile(&namespace("team"), Some(&config_map(data)), CA);
            let [Action::Update(updated)] = actions.as_slice() else { panic!("{actions:?}") };
            assert_eq!(updated["data"], json!({KEY: CA}));
            assert_eq!(updated["metadata"]["resourceVersion"], "7", "a compare-and-swap on the cached version");
        }
    }

    #[test]
    fn a_terminating_namespace_gets_nothing() {
        let mut ns = namespace("team");
        ns.metadata.deletion_timestamp = Some(Time(chrono::Utc::now()));
        assert!(reconcile(&ns, None, CA).is_empty());
    }
}
