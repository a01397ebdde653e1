//! The Node authorizer, as Kubernetes' of that name: a node
//! (`system:node:NAME` in `system:nodes`) reads a Secret, ConfigMap or
//! PersistentVolumeClaim, or asks for a ServiceAccount's token, only when
//! a pod bound to it names that object; everything else a node agent
//! needs it holds through [`node_rules`](crate::rbac::bootstrap::node_rules).
//! What it does not allow, RBAC is asked next (an administrator may bind
//! more to a node), and a refusal names both reasons, as kube-apiserver's
//! does. Which objects of a kind a node may write is NodeRestriction's
//! business (`node_restriction.rs`).
//!
//! [`NodeGraph`] is the graph it decides by: node → the objects its pods
//! reference, with a count per edge, kept by following every pod write on
//! this member (only the referencing fields of a pod are decoded; unbound
//! pods add nothing). Until the first full read of the pods, nodes get
//! nothing from the graph.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use skiff_api::pod_refs::PodReferences;
use skiff_api::resources::{self, Kind};
use skiff_api::ApiError;
use skiff_raft_store::changes::EventKind;
use skiff_shutdown::Shutdown;

use crate::admission::{Attributes, Authorizer, UserInfo};
use crate::node_restriction::node_name;
use crate::rbac::{Action, Rule};
use crate::storage::{prefix_end, ObjectStore};

/// How long to wait before reading again after a failed read.
const RETRY: Duration = Duration::from_secs(1);
/// Pods per page of the full read.
const PAGE: i64 = 1000;

/// The kinds of object the graph links nodes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Referenced {
    Secret,
    ConfigMap,
    Claim,
    ServiceAccount,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Edge {
    node: String,
    kind: Referenced,
    namespace: String,
    name: String,
}

#[derive(Default)]
struct Graph {
    loaded: bool,
    /// Each bound pod's edges, by storage key.
    pods: HashMap<Vec<u8>, Vec<Edge>>,
    /// How many pods hold each edge.
    edges: HashMap<Edge, u32>,
}

impl Graph {
    fn remove(&mut self, key: &[u8]) {
        for edge in self.pods.remove(key).into_iter().flatten() {
            if let Some(count) = self.edges.get_mut(&edge) {
                *count -= 1;
                if *count == 0 {
                    self.edges.remove(&edge);
                }
            }
        }
    }

    /// Replaces what the pod at `key` (in `namespace`) references.
    fn put(&mut self, key: &[u8], namespace: &str, refs: PodReferences) {
        self.remove(key);
        if refs.node_name.is_empty() {
            return;
        }
        let node = refs.node_name;
        let edge = |kind, name: String| Edge { node: node.clone(), kind, namespace: namespace.to_string(), name };
        let mut edges: Vec<Edge> = refs
            .secrets
            .into_iter()
            .map(|n| edge(Referenced::Secret, n))
            .chain(refs.config_maps.into_iter().map(|n| edge(Referenced::ConfigMap, n)))
            .chain(refs.claims.into_iter().map(|n| edge(Referenced::Claim, n)))
            .collect();
        let account = if refs.service_account.is_empty() {
            skiff_api::pod_refs::DEFAULT_SERVICE_ACCOUNT
        } else {
            &refs.service_account
        };
        edges.push(edge(Referenced::ServiceAccount, account.to_string()));
        for e in &edges {
            *self.edges.entry(e.clone()).or_default() += 1;
        }
        self.pods.insert(key.to_vec(), edges);
    }
}

/// Which objects each node's pods reference, following this member's store.
#[derive(Clone, Default)]
pub struct NodeGraph {
    graph: Arc<RwLock<Graph>>,
}

impl NodeGraph {
    /// Reads every pod, then follows their changes until `shutdown`.
    pub fn start(objects: ObjectStore, shutdown: &Shutdown) -> NodeGraph {
        let graph = NodeGraph::default();
        let follower = graph.clone();
        let stopped = shutdown.cancelled_owned();
        shutdown.spawn(async move {
            tokio::select! {
                () = follower.follow(objects) => {}
                () = stopped => {}
            }
        });
        graph
    }

    /// Whether a pod bound to `node` references the object; `None` while
    /// the graph is not loaded.
    pub fn links(&self, node: &str, kind: Referenced, namespace: &str, name: &str) -> Option<bool> {
        let graph = self.graph.read().expect("node graph lock poisoned");
        let edge = Edge { node: node.into(), kind, namespace: namespace.into(), name: name.into() };
        graph.loaded.then(|| graph.edges.contains_key(&edge))
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Graph> {
        self.graph.write().expect("node graph lock poisoned")
    }

    async fn follow(&self, objects: ObjectStore) {
        let prefix = resources::of(Kind::Pod).prefix().into_bytes();
        let end = prefix_end(&prefix);
        loop {
            // Subscribe before reading: no change after the read is missed.
            let mut feed = objects.store.subscribe(&prefix, &end, None);
            match load(&objects, &prefix, &end, feed.next_revision() - 1).await {
                Ok(graph) => *self.write() = graph,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the pods for the node authorizer");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
            loop {
                let revisions = match feed.next().await {
                    Ok(revisions) => revisions,
                    Err(e) => {
                        // Compacted past us, or the store stopped: read again.
                        tracing::debug!(error = %e, "the node authorizer's pod feed ended");
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                };
                let mut graph = self.write();
                for event in revisions.iter().flat_map(|r| r.events.iter()) {
                    let key = &event.kv.key;
                    let Some(namespace) = namespace_of(&prefix, key) else { continue };
                    match event.kind {
                        EventKind::Delete => graph.remove(key),
                        EventKind::Put => match stored_references(&objects, key, &event.kv.value) {
                            Ok(Some(refs)) => graph.put(key, namespace, refs),
                            Ok(None) => graph.remove(key),
                            Err(e) => {
                                tracing::warn!(error = %e, "a pod the node authorizer cannot read");
                                graph.remove(key);
                            }
                        },
                    }
                }
            }
        }
    }
}

/// The namespace of a pod's storage key under `prefix` (`<ns>/<name>`).
fn namespace_of<'k>(prefix: &[u8], key: &'k [u8]) -> Option<&'k str> {
    let rest = std::str::from_utf8(key.strip_prefix(prefix)?).ok()?;
    Some(rest.split_once('/')?.0)
}

fn stored_references(objects: &ObjectStore, key: &[u8], value: &[u8]) -> Result<Option<PodReferences>, ApiError> {
    let opened = objects.open(key, value)?;
    references(&opened.bytes).map_err(|e| ApiError::internal(format!("pod is not JSON: {e}")))
}

/// What a bound pod references; `None` for a pod bound to no node.
///
/// Most pods are written unbound and bound later, and every member runs
/// this for every pod written: a pod whose bytes never say `"nodeName"`
/// cannot be bound, so it is not decoded at all (the apiserver writes
/// the JSON it stores, so the key is never escaped).
fn references(json: &[u8]) -> Result<Option<PodReferences>, serde_json::Error> {
    if memchr::memmem::find(json, b"\"nodeName\"").is_none() {
        return Ok(None);
    }
    let refs = PodReferences::from_json(json)?;
    Ok((!refs.node_name.is_empty()).then_some(refs))
}

/// Every pod at `revision`, page by page.
async fn load(objects: &ObjectStore, prefix: &[u8], end: &[u8], revision: i64) -> Result<Graph, ApiError> {
    let mut graph = Graph { loaded: true, ..Graph::default() };
    let mut start = prefix.to_vec();
    loop {
        let page = objects.range(&start, end, revision, PAGE).await?;
        for item in &page.items {
            let Some(namespace) = namespace_of(prefix, &item.key) else { continue };
            match references(&item.json) {
                Ok(Some(refs)) => graph.put(&item.key, namespace, refs),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "a pod the node authorizer cannot read"),
            }
        }
        match page.items.last() {
            Some(last) if page.more => {
                start = last.key.clone();
                start.push(0);
            }
            _ => return Ok(graph),
        }
    }
}

/// What the Node authorizer says about one request.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Allow,
    /// Not allowed here; the reason, if the graph was asked.
    NoOpinion(Option<String>),
}

/// The Node authorizer in front of `next` (RBAC).
pub struct NodeAuthorizer {
    graph: NodeGraph,
    rules: Vec<Rule>,
    next: Arc<dyn Authorizer>,
}

impl NodeAuthorizer {
    pub fn new(graph: NodeGraph, next: Arc<dyn Authorizer>) -> NodeAuthorizer {
        let rules = crate::rbac::bootstrap::node_rules().iter().map(Rule::from_json).collect();
        NodeAuthorizer { graph, rules, next }
    }

    fn decide(&self, node: &str, action: &Action<'_>) -> Decision {
        let Action::Resource { verb, group: "", resource, subresource, namespace, name } = *action else {
            return self.by_rules(action);
        };
        let kind = match (resource, subresource) {
            ("secrets", "") => Referenced::Secret,
            ("configmaps", "") => Referenced::ConfigMap,
            ("persistentvolumeclaims", "") => Referenced::Claim,
            ("serviceaccounts", "token") => Referenced::ServiceAccount,
            ("persistentvolumes", "") => {
                // Skiff binds no persistent volumes to claims: no pod can
                // lead a node to one.
                return Decision::NoOpinion(Some(no_relationship(node)));
            }
            _ => return self.by_rules(action),
        };
        let wanted = if kind == Referenced::ServiceAccount { "create" } else { "get" };
        if verb != wanted || name.is_empty() {
            return Decision::NoOpinion(Some(format!("can only {wanted} individual resources of this type")));
        }
        match self.graph.links(node, kind, namespace, name) {
            Some(true) => Decision::Allow,
            Some(false) => Decision::NoOpinion(Some(no_relationship(node))),
            None => Decision::NoOpinion(Some("the node authorizer has not read the pods yet".into())),
        }
    }

    fn by_rules(&self, action: &Action<'_>) -> Decision {
        if self.rules.iter().any(|r| r.allows(action)) {
            Decision::Allow
        } else {
            Decision::NoOpinion(None)
        }
    }
}

fn no_relationship(node: &str) -> String {
    format!("no relationship found between node '{node}' and this object")
}

impl Authorizer for NodeAuthorizer {
    fn authorize(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String> {
        let Some(node) = node_name(user) else { return self.next.authorize(user, action) };
        let reason = match self.decide(node, action) {
            Decision::Allow => return Ok(()),
            Decision::NoOpinion(reason) => reason,
        };
        self.next.authorize(user, action).map_err(|denial| match reason {
            Some(reason) => format!("{denial}: {reason}"),
            None => denial,
        })
    }

    fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<Vec<Rule>> {
        let mut rules = self.next.rules_for(user, namespace)?;
        if node_name(user).is_some() {
            rules.extend(self.rules.iter().cloned());
        }
        Some(rules)
    }

    fn check_escalation(&self, user: &UserInfo, attrs: &Attributes<'_>, obj: &serde_json::Value) -> Result<(), String> {
        self.next.check_escalation(user, attrs, obj)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::UserInfo;

    /// RBAC that allows nothing.
    struct Nothing;

    impl Authorizer for Nothing {
        fn authorize(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String> {
            Err(action.denial(user))
        }
    }

    fn node(name: &str) -> UserInfo {
        UserInfo { name: format!("system:node:{name}"), groups: vec!["system:nodes".into()] }
    }

    fn key(ns: &str, name: &str) -> Vec<u8> {
        resources::of(Kind::Pod).key(Some(ns), name).into_bytes()
    }

    fn pod(node: &str, secret: &str) -> PodReferences {
        let pod = json!({"spec": {"nodeName": node, "serviceAccountName": "builder",
            "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "settings"}}]}],
            "volumes": [{"name": "s", "secret": {"secretName": secret}}]}});
        PodReferences::from_json(&serde_json::to_vec(&pod).unwrap()).unwrap()
    }

    fn authorizer() -> NodeAuthorizer {
        let graph = NodeGraph::default();
        {
            let mut g = graph.write();
            g.loaded = true;
            g.put(&key("team", "web-1"), "team", pod("node-a", "web-tls"));
            g.put(&key("team", "web-2"), "team", pod("node-a", "web-tls"));
            g.put(&key("team", "db"), "team", pod("node-b", "db-password"));
            g.put(&key("team", "pending"), "team", pod("", "pending-secret"));
        }
        NodeAuthorizer::new(graph, Arc::new(Nothing))
    }

    fn get<'a>(resource: &'a str, namespace: &'a str, name: &'a str) -> Action<'a> {
        Action::Resource { verb: "get", group: "", resource, subresource: "", namespace, name }
    }

    #[test]
    fn a_node_reads_what_its_own_pods_reference_and_nothing_else() {
        let a = authorizer();
        let node_a = node("node-a");
        assert_eq!(a.authorize(&node_a, &get("secrets", "team", "web-tls")), Ok(()));
        assert_eq!(a.authorize(&node_a, &get("configmaps", "team", "settings")), Ok(()));
        let refused = a.authorize(&node_a, &get("secrets", "team", "db-password")).unwrap_err();
        assert_eq!(
            refused,
            "User \"system:node:node-a\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team\": \
             no relationship found between node 'node-a' and this object"
        );
        // An unbound pod leads no node to its secret; nor does another namespace.
        assert!(a.authorize(&node_a, &get("secrets", "team", "pending-secret")).is_err());
        assert!(a.authorize(&node_a, &get("secrets", "other", "web-tls")).is_err());
        // Another node does not borrow node-a's edges.
        assert!(a.authorize(&node("node-b"), &get("secrets", "team", "web-tls")).is_err());
        assert_eq!(a.authorize(&node("node-b"), &get("secrets", "team", "db-password")), Ok(()));

        // Only single gets: no list or watch of the kind.
        let list = Action::Resource {
            verb: "list",
            group: "",
            resource: "secrets",
            subresource: "",
            namespace: "team",
            name: "",
        };
        assert!(a.authorize(&node_a, &list).unwrap_err().ends_with("can only get individual resources of this type"));
    }

    #[test]
    fn service_account_tokens_follow_the_pods_and_edges_go_with_the_last_pod() {
        let a = authorizer();
        let token = |namespace: &'static str, name: &'static str| Action::Resource {
            verb: "create",
            group: "",
            resource: "serviceaccounts",
            subresource: "token",
            namespace,
            name,
        };
        let node_a = node("node-a");
        assert_eq!(a.authorize(&node_a, &token("team", "builder")), Ok(()));
        assert!(a.authorize(&node_a, &token("team", "default")).is_err());

        // Two pods hold the secret's edge: it goes with the second.
        a.graph.write().remove(&key("team", "web-1"));
        assert_eq!(a.authorize(&node_a, &get("secrets", "team", "web-tls")), Ok(()));
        a.graph.write().remove(&key("team", "web-2"));
        assert!(a.authorize(&node_a, &get("secrets", "team", "web-tls")).is_err());
        assert!(a.authorize(&node_a, &token("team", "builder")).is_err());
        assert!(a.graph.read_edges_empty_for("node-a"));
    }

    #[test]
    fn the_rest_of_a_nodes_needs_come_from_its_rules_and_others_go_to_rbac() {
        let a = authorizer();
        let node_a = node("node-a");
        let pods =
            Action::Resource { verb: "watch", group: "", resource: "pods", subresource: "", namespace: "", name: "" };
        assert_eq!(a.authorize(&node_a, &pods), Ok(()));
        let deployments = Action::Resource {
            verb: "create",
            group: "apps",
            resource: "deployments",
            subresource: "",
            namespace: "team",
            name: "",
        };
        assert!(a.authorize(&node_a, &deployments).is_err());

        // Not a node: RBAC alone decides.
        let user = UserInfo { name: "alice".into(), groups: vec![] };
        assert!(a.authorize(&user, &get("secrets", "team", "web-tls")).is_err());
        // A user named like a node but outside system:nodes is no node.
        let impostor = UserInfo { name: "system:node:node-a".into(), groups: vec![] };
        assert!(a.authorize(&impostor, &get("secrets", "team", "web-tls")).is_err());
    }

    #[test]
    fn until_the_pods_are_read_the_graph_grants_nothing() {
        let a = NodeAuthorizer::new(NodeGraph::default(), Arc::new(Nothing));
        let refused = a.authorize(&node("node-a"), &get("secrets", "team", "web-tls")).unwrap_err();
        assert!(refused.ends_with("the node authorizer has not read the pods yet"), "{refused}");
    }

    #[test]
    fn only_pods_that_name_a_node_are_decoded() {
        let unbound = br#"{"metadata":{"name":"web"},"spec":{"volumes":[{"name":"s","secret":{"secretName":"tls"}}]}}"#;
        assert!(references(unbound).unwrap().is_none());
        // Never decoded, so not even malformed bytes are an error.
        assert!(references(b"{not json").unwrap().is_none());
        // Saying "nodeName" elsewhere is not being bound.
        let mentioned = br#"{"metadata":{"annotations":{"note":"\"nodeName\""}},"spec":{}}"#;
        assert!(references(mentioned).unwrap().is_none());
        assert!(references(br#"{"spec":{"nodeName":"#).is_err());

        let bound = br#"{"spec":{"nodeName":"node-a","volumes":[{"name":"s","secret":{"secretName":"tls"}}]}}"#;
        let refs = references(bound).unwrap().expect("a bound pod");
        assert_eq!(refs.node_name, "node-a");
        assert_eq!(refs.secrets.into_iter().collect::<Vec<_>>(), ["tls"]);
    }

    #[test]
    fn keys_name_their_namespace() {
        let prefix = resources::of(Kind::Pod).prefix().into_bytes();
        assert_eq!(namespace_of(&prefix, &key("team", "web")), Some("team"));
        assert_eq!(namespace_of(&prefix, b"/registry/services/team/web"), None);
    }

    impl NodeGraph {
        fn read_edges_empty_for(&self, node: &str) -> bool {
            let graph = self.graph.read().unwrap();
            !graph.edges.keys().any(|e| e.node == node) && graph.edges.values().all(|c| *c > 0)
        }
    }
}
