//! Namespaces: created `Active` with `kubernetes` in `spec.finalizers`
//! (the namespace controller's, as Kubernetes adds it whatever the client
//! sent); a delete of a namespace with `spec.finalizers` only marks it
//! `Terminating`, and it stays until its content is gone and the
//! finalizers are removed through the `finalize` subresource, the only
//! way to change them (an update of the namespace keeps them). The
//! NamespaceLifecycle rule (no new content in a terminating namespace) is
//! the registry's, as it applies to objects of every namespaced kind.

use serde_json::{json, Value};
use skiff_api::resources::ResourceInfo;

use super::Strategy;

/// The namespace controller's finalizer.
const FINALIZER: &str = "kubernetes";

pub struct Namespace;

impl Strategy for Namespace {
    fn prepare_for_create(&self, info: &ResourceInfo, obj: &mut Value) {
        super::Default.prepare_for_create(info, obj);
        obj["status"] = json!({"phase": "Active"});
        let mut finalizers = obj["spec"]["finalizers"].as_array().cloned().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            finalizers.push(json!(FINALIZER));
        }
        obj["spec"]["finalizers"] = json!(finalizers);
    }

    fn prepare_for_update(&self, info: &ResourceInfo, obj: &mut Value, old: &Value) {
        super::Default.prepare_for_update(info, obj, old);
        match old["spec"].get("finalizers") {
            Some(f) => obj["spec"]["finalizers"] = f.clone(),
            None => {
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("finalizers");
                }
            }
        }
    }

    fn finalizing(&self, obj: &Value) -> bool {
        obj["spec"]["finalizers"].as_array().is_some_and(|f| !f.is_empty())
    }

    fn prepare_for_delete(&self, obj: &mut Value) -> bool {
        let finalizing = self.finalizing(obj);
        if finalizing {
            obj["status"]["phase"] = json!("Terminating");
        }
        finalizing
    }
}

#[cfg(test)]
mod tests {
    use skiff_api::resources::{self, Kind};

    use super::*;

    #[test]
    fn a_namespace_is_created_active_whatever_status_it_was_sent_with() {
        let mut ns = json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}});
        Namespace.prepare_for_create(resources::of(Kind::Namespace), &mut ns);
        assert_eq!(ns["status"], json!({"phase": "Active"}));
    }

    #[test]
    fn a_namespace_is_created_with_the_kubernetes_finalizer_added_to_any_others() {
        let mut ns = json!({"metadata": {"name": "a"}});
        Namespace.prepare_for_create(resources::of(Kind::Namespace), &mut ns);
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        let mut ns = json!({"metadata": {"name": "a"}, "spec": {"finalizers": ["example.com/x"]}});
        Namespace.prepare_for_create(resources::of(Kind::Namespace), &mut ns);
        assert_eq!(ns["spec"]["finalizers"], json!(["example.com/x", "kubernetes"]));
    }

    #[test]
    fn an_update_keeps_the_stored_finalizers() {
        let old =
            json!({"metadata": {"name": "a"}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        let mut new = json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"finalizers": []}});
        Namespace.prepare_for_update(resources::of(Kind::Namespace), &mut new, &old);
        assert_eq!(new["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(new["status"], json!({"phase": "Active"}));
        assert!(Namespace.finalizing(&new));
    }

    #[test]
    fn only_a_namespace_with_spec_finalizers_waits_for_them_on_delete() {
        let mut ns = json!({"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        assert!(Namespace.prepare_for_delete(&mut ns));
        assert_eq!(ns["status"]["phase"], "Terminating");
        let mut ns = json!({"spec": {"finalizers": []}, "status": {"phase": "Active"}});
        assert!(!Namespace.prepare_for_delete(&mut ns));
        assert_eq!(ns["status"]["phase"], "Active");
    }
}
