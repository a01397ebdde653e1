//! Which objects a controller owns, as Kubernetes' `ControllerRefManager`:
//! an object belongs to the controller its `ownerReferences` entry with
//! `controller: true` names. A controller adopts orphans its selector
//! matches and releases objects it owns that its selector no longer
//! matches; objects another controller owns are never touched.
//!
//! Adoption and release are JSON merge patches of `ownerReferences`; the
//! patch carries the object's `uid` and `resourceVersion`, so it fails
//! rather than overwrite a list changed since the cache saw it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{json, Value};

use crate::Action;

/// The controller that owns an object (the entry with `controller: true`).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// `namespace/name`, the key controllers, expectations and queues use.
pub fn key_of(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""))
}

/// The key of the controller of `kind` that owns an object, for the wiring
/// to route an event (and lower expectations) to its owner.
pub fn owner_key(meta: &ObjectMeta, kind: &str) -> Option<String> {
    let owner = controller_of(meta).filter(|r| r.kind == kind)?;
    Some(format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), owner.name))
}

/// The controller reference a controller puts on what it creates or adopts.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// What a controller makes of one candidate object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Owned and selected: the controller manages it.
    Owned,
    /// An orphan the selector matches: adopt it, then manage it.
    Adopt,
    /// Owned but no longer selected: let it go.
    Release,
    /// Someone else's, or not selected: leave it alone.
    Ignore,
}

/// How a controller (`owner`, being deleted or not) regards an object
/// whose labels its selector does or does not match. Objects being deleted
/// are not adopted.
pub fn claim(owner: &ObjectMeta, object: &ObjectMeta, selected: bool) -> Claim {
    let owner_deleting = owner.deletion_timestamp.is_some();
    match controller_of(object) {
        Some(r) if Some(&r.uid) == owner.uid.as_ref() => {
            if selected {
                Claim::Owned
            } else if owner_deleting {
                Claim::Ignore
            } else {
                Claim::Release
            }
        }
        Some(_) => Claim::Ignore,
        None if selected && !owner_deleting && object.deletion_timestamp.is_none() => Claim::Adopt,
        None => Claim::Ignore,
    }
}

/// The patch that makes `owner_ref` the controller of `object`.
pub fn adopt(api_version: &str, kind: &str, object: &ObjectMeta, owner_ref: &OwnerReference) -> Action {
    let mut refs: Vec<Value> = object
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_ref.uid)
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    refs.extend(serde_json::to_value(owner_ref).ok());
    owner_patch(api_version, kind, object, refs)
}

/// The patch that removes the reference to the owner with `owner_uid`.
pub fn release(api_version: &str, kind: &str, object: &ObjectMeta, owner_uid: &str) -> Action {
    let refs: Vec<Value> = object
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_uid)
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    owner_patch(api_version, kind, object, refs)
}

fn owner_patch(api_version: &str, kind: &str, object: &ObjectMeta, refs: Vec<Value>) -> Action {
    Action::Patch {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        namespace: object.namespace.clone().unwrap_or_default(),
        name: object.name.clone().unwrap_or_default(),
        patch: json!({"metadata": {
            "ownerReferences": refs,
            "uid": object.uid,
            "resourceVersion": object.resource_version,
        }}),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn meta(name: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            resource_version: Some("7".into()),
            ..Default::default()
        }
    }

    fn owned_by(mut m: ObjectMeta, owner: &ObjectMeta) -> ObjectMeta {
        m.owner_references = Some(vec![controller_ref("apps/v1", "ReplicaSet", owner)]);
        m
    }

    #[test]
    fn a_controller_keeps_what_it_owns_and_selects() {
        let rs = meta("web", "rs-1");
        let pod = owned_by(meta("p", "p-1"), &rs);
        assert_eq!(claim(&rs, &pod, true), Claim::Owned);
        assert_eq!(claim(&rs, &pod, false), Claim::Release);
        assert_eq!(owner_key(&pod, "ReplicaSet").as_deref(), Some("ns/web"));
        assert_eq!(owner_key(&pod, "Job"), None);
    }

    #[test]
    fn orphans_are_adopted_only_when_selected_and_alive() {
        let rs = meta("web", "rs-1");
        let mut pod = meta("p", "p-1");
        assert_eq!(claim(&rs, &pod, true), Claim::Adopt);
        assert_eq!(claim(&rs, &pod, false), Claim::Ignore);
        pod.deletion_timestamp = Some(Time(chrono::Utc::now()));
        assert_eq!(claim(&rs, &pod, true), Claim::Ignore);
        let mut deleting = rs.clone();
        deleting.deletion_timestamp = Some(Time(chrono::Utc::now()));
        assert_eq!(claim(&deleting, &meta("q", "q-1"), true), Claim::Ignore);
    }

    #[test]
    fn another_controllers_object_is_left_alone() {
        let other = meta("api", "rs-2");
        let pod = owned_by(meta("p", "p-1"), &other);
        assert_eq!(claim(&meta("web", "rs-1"), &pod, true), Claim::Ignore);
    }

    #[test]
    fn adoption_and_release_patch_the_owner_list_with_preconditions() {
        let rs = meta("web", "rs-1");
        let pod = meta("p", "p-1");
        let Action::Patch { patch, name, kind, .. } =
            adopt("v1", "Pod", &pod, &controller_ref("apps/v1", "ReplicaSet", &rs))
        else {
            panic!("adoption is a patch")
        };
        assert_eq!((name.as_str(), kind.as_str()), ("p", "Pod"));
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "rs-1");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(patch["metadata"]["ownerReferences"][0]["blockOwnerDeletion"], true);
        assert_eq!(patch["metadata"]["uid"], "p-1");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");

        let owned = owned_by(pod, &rs);
        let Action::Patch { patch, .. } = release("v1", "Pod", &owned, "rs-1") else { panic!("release is a patch") };
        assert_eq!(patch["metadata"]["ownerReferences"], json!([]));
    }
}
