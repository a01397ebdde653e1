//! The garbage collector: deletes objects whose owners are gone, and
//! carries out the `Foreground` and `Orphan` propagation policies that the
//! apiserver records as the `foregroundDeletion` and `orphan` finalizers.
//!
//! A [`Graph`] of every object the informers see (of every kind: an owner
//! need not have owners itself) is kept up to date from watch events with
//! [`Graph::observe`] and [`Graph::forget`]; both return the uids whose
//! objects should be looked at again, which the wiring puts on its work
//! queue. [`Graph::reconcile`] of one uid returns what to do:
//!
//! - a dependent whose owners are all gone is deleted (`Background`); one
//!   with some owners left only loses the references to the gone ones;
//! - an owner marked for deletion with `foregroundDeletion` has its
//!   dependents deleted (those that block it first, each in `Foreground`
//!   too), and loses the finalizer once no dependent blocks it;
//! - an owner marked for deletion with `orphan` has its references removed
//!   from its dependents, then loses the finalizer.
//!
//! Owners are matched by uid, so an owner deleted and created again under
//! the same name is a different owner. The graph only knows what the
//! informers delivered: the wiring calls `reconcile` only once every
//! informer has synced, and, as Kubernetes does, should confirm with a live
//! read that an owner is absent before deleting its dependents (an owner
//! created a moment ago may not have reached its informer yet).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use skiff_api::meta;

use crate::action::Action;

/// The finalizer of a `Foreground` delete.
pub const FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of an `Orphan` delete.
pub const ORPHAN: &str = "orphan";

/// One `metadata.ownerReferences` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    /// `blockOwnerDeletion`: a foreground delete of the owner waits for
    /// this dependent to be gone.
    pub block_owner_deletion: bool,
    /// The entry as stored, written back unchanged when others are removed.
    raw: Value,
}

/// What the graph keeps of one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The stored version, made a precondition of every patch.
    pub resource_version: String,
    pub owners: Vec<OwnerRef>,
    pub finalizers: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

impl Node {
    /// The graph's view of an object's JSON; `None` without a uid.
    pub fn of(obj: &Value) -> Option<Node> {
        let uid = meta::uid(obj)?.to_string();
        let owners = obj["metadata"]["ownerReferences"]
            .as_array()
            .map(|refs| {
                refs.iter()
                    .filter_map(|r| {
                        Some(OwnerRef {
                            api_version: r["apiVersion"].as_str()?.to_string(),
                            kind: r["kind"].as_str()?.to_string(),
                            name: r["name"].as_str()?.to_string(),
                            uid: r["uid"].as_str()?.to_string(),
                            block_owner_deletion: r["blockOwnerDeletion"].as_bool().unwrap_or(false),
                            raw: r.clone(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Node {
            api_version: obj["apiVersion"].as_str().unwrap_or_default().to_string(),
            kind: obj["kind"].as_str().unwrap_or_default().to_string(),
            namespace: meta::namespace(obj).unwrap_or_default().to_string(),
            name: meta::name(obj).unwrap_or_default().to_string(),
            uid,
            resource_version: meta::resource_version(obj).unwrap_or_default().to_string(),
            owners,
            finalizers: meta::finalizers(obj),
            deleting: meta::deletion_timestamp(obj).is_some(),
        })
    }

    fn waits_for_dependents(&self) -> bool {
        self.deleting && self.finalizers.iter().any(|f| f == FOREGROUND)
    }

    fn orphans_dependents(&self) -> bool {
        self.deleting && self.finalizers.iter().any(|f| f == ORPHAN)
    }

    fn delete(&self, propagation: &str) -> Action {
        Action::Delete {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: Some(self.uid.clone()),
            propagation: Some(propagation.to_string()),
        }
    }

    /// A merge patch (guarded by resourceVersion) of `metadata`.
    fn patch_metadata(&self, metadata: Value) -> Action {
        let mut metadata = metadata;
        metadata["resourceVersion"] = json!(self.resource_version);
        Action::Patch {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            patch: json!({ "metadata": metadata }),
        }
    }

    /// This object without the owner references `drop` says to remove.
    fn without_owners(&self, drop: impl Fn(&OwnerRef) -> bool) -> Action {
        let kept: Vec<&Value> = self.owners.iter().filter(|o| !drop(o)).map(|o| &o.raw).collect();
        self.patch_metadata(json!({ "ownerReferences": none_if_empty(kept) }))
    }

    fn without_finalizer(&self, finalizer: &str) -> Action {
        let kept: Vec<&String> = self.finalizers.iter().filter(|f| *f != finalizer).collect();
        self.patch_metadata(json!({ "finalizers": none_if_empty(kept) }))
    }
}

/// A list, or null (which a merge patch takes as "remove the field") when
/// it is empty: a built-in object leaves an empty list out, and so must a
/// custom one, whose JSON is stored as written.
fn none_if_empty<T: serde::Serialize>(list: Vec<T>) -> Value {
    if list.is_empty() {
        Value::Null
    } else {
        json!(list)
    }
}

/// Every object seen, and who depends on whom.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: BTreeMap<String, Node>,
    /// Owner uid → the uids of objects naming it, whether or not the owner
    /// itself has been seen.
    dependents: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    /// An object added or updated; returns the uids to reconcile.
    pub fn observe(&mut self, obj: &Value) -> Vec<String> {
        let Some(node) = Node::of(obj) else { return vec![] };
        let uid = node.uid.clone();
        let mut affected = BTreeSet::from([uid.clone()]);
        if let Some(old) = self.nodes.remove(&uid) {
            for owner in &old.owners {
                self.unlink(&owner.uid, &uid);
                affected.insert(owner.uid.clone());
            }
        }
        for owner in &node.owners {
            self.dependents.entry(owner.uid.clone()).or_default().insert(uid.clone());
            affected.insert(owner.uid.clone());
        }
        // A new owner, or one now being deleted, concerns its dependents.
        affected.extend(self.dependents.get(&uid).into_iter().flatten().cloned());
        self.nodes.insert(uid, node);
        affected.into_iter().filter(|u| self.nodes.contains_key(u)).collect()
    }

    /// An object deleted; returns the uids to reconcile: its dependents
    /// (their owner may be gone) and its owners (one may wait for it).
    pub fn forget(&mut self, obj: &Value) -> Vec<String> {
        let Some(uid) = meta::uid(obj) else { return vec![] };
        let mut affected = BTreeSet::new();
        if let Some(old) = self.nodes.remove(uid) {
            for owner in &old.owners {
                self.unlink(&owner.uid, uid);
                affected.insert(owner.uid.clone());
            }
        }
        affected.extend(self.dependents.get(uid).into_iter().flatten().cloned());
        affected.into_iter().filter(|u| self.nodes.contains_key(u)).collect()
    }

    fn unlink(&mut self, owner: &str, dependent: &str) {
        if let Some(set) = self.dependents.get_mut(owner) {
            set.remove(dependent);
            if set.is_empty() {
                self.dependents.remove(owner);
            }
        }
    }

    pub fn get(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    /// The objects that name `uid` as an owner.
    pub fn dependents_of(&self, uid: &str) -> Vec<&Node> {
        self.dependents.get(uid).into_iter().flatten().filter_map(|d| self.nodes.get(d)).collect()
    }

    /// An owner is present when an object with its uid is in the graph
    /// (in the dependent's namespace, or cluster-scoped).
    fn owner_present(&self, dependent: &Node, owner: &OwnerRef) -> Option<&Node> {
        self.nodes.get(&owner.uid).filter(|o| o.namespace.is_empty() || o.namespace == dependent.namespace)
    }

    /// What to do about the object `uid` now.
    pub fn reconcile(&self, uid: &str) -> Vec<Action> {
        let Some(node) = self.nodes.get(uid) else { return vec![] };
        let mut actions = Vec::new();
        if node.orphans_dependents() {
            actions.extend(self.orphan(node));
        } else if node.waits_for_dependents() {
            actions.extend(self.delete_dependents(node));
        }
        // A dependent marked for deletion is on its way; nothing to add
        // about its owners.
        if !node.deleting {
            actions.extend(self.check_owners(node));
        }
        actions
    }

    /// `orphan`: drop the reference from every dependent, then the finalizer.
    fn orphan(&self, owner: &Node) -> Vec<Action> {
        let mut actions: Vec<Action> =
            self.dependents_of(&owner.uid).into_iter().map(|d| d.without_owners(|o| o.uid == owner.uid)).collect();
        actions.push(owner.without_finalizer(ORPHAN));
        actions
    }

    /// `foregroundDeletion`: delete the dependents (blocking ones first);
    /// the finalizer goes once none blocks.
    fn delete_dependents(&self, owner: &Node) -> Vec<Action> {
        let mut dependents = self.dependents_of(&owner.uid);
        let blocks = |d: &Node| d.owners.iter().any(|o| o.uid == owner.uid && o.block_owner_deletion);
        dependents.sort_by_key(|d| !blocks(d));
        let mut actions = Vec::new();
        let mut blocking = false;
        for dependent in dependents {
            blocking |= blocks(dependent);
            if dependent.deleting {
                continue;
            }
            // A dependent another live owner still holds only lets go of
            // this one, as Kubernetes does.
            let held = dependent.owners.iter().any(|o| {
                o.uid != owner.uid
                    && self.owner_present(dependent, o).is_some_and(|n| !n.waits_for_dependents() && !n.deleting)
            });
            if held {
                actions.push(dependent.without_owners(|o| o.uid == owner.uid));
            } else {
                actions.push(dependent.delete("Foreground"));
            }
        }
        if !blocking {
            actions.push(owner.without_finalizer(FOREGROUND));
        }
        actions
    }

    /// A dependent with owners gone: deleted when all are, else freed of
    /// the references to the gone ones.
    fn check_owners(&self, node: &Node) -> Vec<Action> {
        if node.owners.is_empty() {
            return vec![];
        }
        let gone: Vec<&OwnerRef> = node.owners.iter().filter(|o| self.owner_present(node, o).is_none()).collect();
        if gone.is_empty() {
            return vec![];
        }
        if gone.len() == node.owners.len() {
            return vec![node.delete("Background")];
        }
        vec![node.without_owners(|o| gone.iter().any(|g| g.uid == o.uid))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, name: &str, owners: &[(&str, bool)], extra: Value) -> Value {
        let refs: Vec<Value> = owners
            .iter()
            .map(|(uid, block)| {
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("owner-{uid}"),
                    "uid": uid, "controller": true, "blockOwnerDeletion": block})
            })
            .collect();
        let mut obj = json!({"apiVersion": if kind == "Pod" { "v1" } else { "apps/v1" }, "kind": kind,
            "metadata": {"name": name, "namespace": "default", "uid": name, "resourceVersion": "5"}});
        if !refs.is_empty() {
            obj["metadata"]["ownerReferences"] = json!(refs);
        }
        if let Some(m) = extra.as_object() {
            for (k, v) in m {
                obj["metadata"][k] = v.clone();
            }
        }
        obj
    }

    fn deleting(finalizer: &str) -> Value {
        json!({"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [finalizer]})
    }

    fn deleted(actions: &[Action]) -> Vec<(String, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { name, propagation, .. } => Some((name.clone(), propagation.clone().unwrap())),
                _ => None,
            })
            .collect()
    }

    fn patches(actions: &[Action]) -> Vec<(String, Value)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Patch { name, patch, .. } => Some((name.clone(), patch.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_dependent_whose_only_owner_is_gone_is_deleted_in_the_background() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], json!({})));
        graph.observe(&object("Pod", "pod", &[("rs", true)], json!({})));
        assert!(graph.reconcile("pod").is_empty(), "its owner exists");
        let affected = graph.forget(&object("ReplicaSet", "rs", &[], json!({})));
        assert_eq!(affected, vec!["pod".to_string()]);
        let actions = graph.reconcile("pod");
        assert_eq!(deleted(&actions), vec![("pod".into(), "Background".into())]);
        assert!(matches!(&actions[0], Action::Delete { uid: Some(u), .. } if u == "pod"));
    }

    #[test]
    fn an_owner_recreated_with_a_new_uid_is_not_the_owner() {
        let mut graph = Graph::new();
        graph.observe(&object("Pod", "pod", &[("rs-old", false)], json!({})));
        let mut recreated = object("ReplicaSet", "rs", &[], json!({}));
        recreated["metadata"]["uid"] = json!("rs-new");
        graph.observe(&recreated);
        assert_eq!(deleted(&graph.reconcile("pod")), vec![("pod".into(), "Background".into())]);
    }

    #[test]
    fn a_dependent_with_a_live_owner_left_only_loses_the_gone_reference() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "a", &[], json!({})));
        graph.observe(&object("Pod", "pod", &[("a", false), ("b", false)], json!({})));
        let actions = graph.reconcile("pod");
        assert!(deleted(&actions).is_empty());
        let (name, patch) = &patches(&actions)[0];
        assert_eq!(name, "pod");
        let refs = patch["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0]["uid"], "a");
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
    }

    #[test]
    fn foreground_deletion_deletes_blocking_dependents_first_and_keeps_the_finalizer() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], deleting(FOREGROUND)));
        graph.observe(&object("Pod", "loose", &[("rs", false)], json!({})));
        graph.observe(&object("Pod", "zed", &[("rs", true)], json!({})));
        let actions = graph.reconcile("rs");
        assert_eq!(deleted(&actions), vec![("zed".into(), "Foreground".into()), ("loose".into(), "Foreground".into())]);
        assert!(patches(&actions).is_empty(), "a blocking dependent remains, so the finalizer stays");
    }

    #[test]
    fn foreground_deletion_removes_the_finalizer_once_no_dependent_blocks() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], deleting(FOREGROUND)));
        graph.observe(&object("Pod", "blocker", &[("rs", true)], json!({"deletionTimestamp": "x"})));
        assert!(graph.reconcile("rs").is_empty(), "the blocker is on its way but not gone");
        let affected = graph.forget(&object("Pod", "blocker", &[("rs", true)], json!({})));
        assert_eq!(affected, vec!["rs".to_string()]);
        let actions = graph.reconcile("rs");
        assert_eq!(
            patches(&actions),
            vec![("rs".into(), json!({"metadata": {"finalizers": null, "resourceVersion": "5"}}))]
        );
    }

    #[test]
    fn a_foreground_dependent_held_by_another_owner_only_lets_go() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], deleting(FOREGROUND)));
        graph.observe(&object("ReplicaSet", "other", &[], json!({})));
        graph.observe(&object("Pod", "shared", &[("rs", true), ("other", false)], json!({})));
        let actions = graph.reconcile("rs");
        assert!(deleted(&actions).is_empty());
        let (name, patch) = &patches(&actions)[0];
        assert_eq!(name, "shared");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "other");
    }

    #[test]
    fn orphaning_removes_the_reference_from_dependents_then_the_finalizer() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], deleting(ORPHAN)));
        graph.observe(&object("Pod", "p1", &[("rs", true)], json!({})));
        let actions = graph.reconcile("rs");
        assert_eq!(
            patches(&actions),
            vec![
                ("p1".into(), json!({"metadata": {"ownerReferences": null, "resourceVersion": "5"}})),
                ("rs".into(), json!({"metadata": {"finalizers": null, "resourceVersion": "5"}})),
            ]
        );
        assert!(deleted(&actions).is_empty(), "orphans are kept");
    }

    #[test]
    fn an_update_that_drops_an_owner_reference_unlinks_the_dependent() {
        let mut graph = Graph::new();
        graph.observe(&object("ReplicaSet", "rs", &[], json!({})));
        graph.observe(&object("Pod", "pod", &[("rs", false)], json!({})));
        assert_eq!(graph.dependents_of("rs").len(), 1);
        let affected = graph.observe(&object("Pod", "pod", &[], json!({})));
        assert!(graph.dependents_of("rs").is_empty());
        assert_eq!(affected, vec!["pod".to_string(), "rs".to_string()]);
    }

    #[test]
    fn an_owner_in_another_namespace_does_not_count() {
        let mut graph = Graph::new();
        let mut rs = object("ReplicaSet", "rs", &[], json!({}));
        rs["metadata"]["namespace"] = json!("elsewhere");
        graph.observe(&rs);
        graph.observe(&object("Pod", "pod", &[("rs", false)], json!({})));
        assert_eq!(deleted(&graph.reconcile("pod")), vec![("pod".into(), "Background".into())]);
    }
}
