//! Namespaces: created `Active`; a delete of a namespace with
//! `spec.finalizers` (the namespace controller's `kubernetes`) only marks
//! it `Terminating`, and it stays until its content is gone and the
//! finalizers are removed through the `finalize` subresource. The
//! NamespaceLifecycle rule (no new content in a terminating namespace) is
//! the registry's, as it applies to objects of every namespaced kind.

use serde_json::{json, Value};
use skiff_api::resources::ResourceInfo;

use super::Strategy;

pub struct Namespace;

impl Strategy for Namespace {
    fn prepare_for_create(&self, info: &ResourceInfo, obj: &mut Value) {
        super::Default.prepare_for_create(info, obj);
        obj["status"] = json!({"phase": "Active"});
    }

    fn prepare_for_delete(&self, obj: &mut Value) -> bool {
        let finalizing = obj["spec"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
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
    fn only_a_namespace_with_spec_finalizers_waits_for_them_on_delete() {
        let mut ns = json!({"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        assert!(Namespace.prepare_for_delete(&mut ns));
        assert_eq!(ns["status"]["phase"], "Terminating");
        let mut ns = json!({"spec": {"finalizers": []}, "status": {"phase": "Active"}});
        assert!(!Namespace.prepare_for_delete(&mut ns));
        assert_eq!(ns["status"]["phase"], "Active");
    }
}
