//! The service account controller: every active namespace has a
//! ServiceAccount named `default`, created again if someone deletes it.
//!
//! The wiring calls [`reconcile`] for a namespace (on its events and on
//! the deletion of a `default` ServiceAccount) with the ServiceAccounts of
//! that namespace from its cache.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use serde_json::json;

use crate::action::Action;

/// The name of the ServiceAccount every namespace gets.
pub const DEFAULT: &str = "default";

/// Creates `default` in `namespace` unless it is there or the namespace
/// is going away (nothing new may be created in a terminating namespace).
pub fn reconcile(namespace: &Namespace, service_accounts: &[ServiceAccount]) -> Vec<Action> {
    let Some(ns) = namespace.metadata.name.as_deref() else { return vec![] };
    let terminating = namespace.metadata.deletion_timestamp.is_some()
        || namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    let present = service_accounts
        .iter()
        .any(|sa| sa.metadata.name.as_deref() == Some(DEFAULT) && sa.metadata.namespace.as_deref() == Some(ns));
    if terminating || present {
        return vec![];
    }
    vec![Action::Create(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": DEFAULT, "namespace": ns},
    }))]
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NamespaceStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn namespace(name: &str) -> Namespace {
        Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn account(ns: &str, name: &str) -> ServiceAccount {
        ServiceAccount {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn a_namespace_without_default_gets_one() {
        let actions = reconcile(&namespace("team"), &[account("team", "builder"), account("other", "default")]);
        assert_eq!(
            actions,
            vec![Action::Create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": "team"}}))]
        );
    }

    #[test]
    fn a_namespace_with_default_needs_nothing() {
        assert!(reconcile(&namespace("team"), &[account("team", "default")]).is_empty());
    }

    #[test]
    fn a_terminating_namespace_gets_nothing() {
        let mut ns = namespace("team");
        ns.status = Some(NamespaceStatus { phase: Some("Terminating".into()), ..Default::default() });
        assert!(reconcile(&ns, &[]).is_empty());
    }
}
