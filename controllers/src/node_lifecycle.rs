//! The node lifecycle controller: judges node health, taints unhealthy
//! nodes `NoExecute`, and evicts the pods that do not tolerate the taints.
//!
//! Health is judged by our own clock, never by comparing the kubelet's
//! timestamps with ours: [`NodeLifecycle::observe_lease`] (the node's Lease
//! in `kube-node-lease`) and [`NodeLifecycle::observe_node`] (its `Ready`
//! condition's `lastHeartbeatTime`) record *when we saw them change*. A node
//! not heard from within `node_monitor_grace_period` gets, in
//! [`NodeLifecycle::monitor`] (run every few seconds with every node):
//!
//! - its conditions set `Unknown` (`NodeStatusUnknown`, "Kubelet stopped
//!   posting node status."), with compare-and-swap so a kubelet that comes
//!   back wins;
//! - the taint `node.kubernetes.io/unreachable:NoExecute`
//!   (`node.kubernetes.io/not-ready:NoExecute` when the kubelet reports
//!   `Ready=False`), removed again once the node is `Ready`.
//!
//! Tainting is rate-limited per zone (`topology.kubernetes.io/zone`) by a
//! [`TokenBucket`], as Kubernetes documents: `node_eviction_rate` (0.1/s)
//! normally; when more than `unhealthy_zone_threshold` (55%) of a zone's
//! nodes (and at least 3) are not ready, `secondary_node_eviction_rate`
//! (0.01/s) in a zone larger than `large_cluster_size_threshold` nodes and
//! none in a smaller one; when every node of every zone is down (this
//! controller is the one likely cut off), none at all.
//!
//! [`NodeLifecycle::evict`] is the taint manager for one node: a pod on a
//! node with a `NoExecute` taint it does not tolerate is deleted at once;
//! one that tolerates it for `tolerationSeconds` is deleted that long after
//! the taint was added (the returned `requeue_after` says when to look
//! again). The apiserver adds no default tolerations (Kubernetes'
//! DefaultTolerationSeconds admission), so a pod without a toleration for
//! the not-ready/unreachable taints is given
//! `default_not_ready_toleration_seconds` /
//! `default_unreachable_toleration_seconds` (300 s) here instead.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use crate::action::Action;

/// The namespace of the kubelets' Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The taint of a node whose kubelet reports `Ready=False`.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// The taint of a node not heard from.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// The label that names a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The conditions a kubelet posts and this controller marks `Unknown`.
const CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The controller's flags, with Kubernetes' defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--node-monitor-grace-period`.
    pub node_monitor_grace_period: Duration,
    /// `--default-not-ready-toleration-seconds`.
    pub default_not_ready_toleration_seconds: i64,
    /// `--default-unreachable-toleration-seconds`.
    pub default_unreachable_toleration_seconds: i64,
    /// `--node-eviction-rate`: nodes tainted per second in a healthy zone.
    pub node_eviction_rate: f64,
    /// `--secondary-node-eviction-rate`: in an unhealthy large zone.
    pub secondary_node_eviction_rate: f64,
    /// `--unhealthy-zone-threshold`: the share of not-ready nodes that
    /// makes a zone unhealthy.
    pub unhealthy_zone_threshold: f64,
    /// `--large-cluster-size-threshold`: zones up to this size stop
    /// evicting when unhealthy.
    pub large_cluster_size_threshold: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_monitor_grace_period: Duration::seconds(40),
            default_not_ready_toleration_seconds: 300,
            default_unreachable_toleration_seconds: 300,
            node_eviction_rate: 0.1,
            secondary_node_eviction_rate: 0.01,
            unhealthy_zone_threshold: 0.55,
            large_cluster_size_threshold: 50,
        }
    }
}

/// What a pass asks for, and when to look again (a token to come, a
/// toleration to run out).
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    pub actions: Vec<Action>,
    pub requeue_after: Option<std::time::Duration>,
}

impl Step {
    fn wake_at(&mut self, at: DateTime<Utc>, now: DateTime<Utc>) {
        let after = (at - now).to_std().unwrap_or_default();
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

/// A token bucket driven by the caller's clock: `rate` tokens a second,
/// holding at most `burst`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: DateTime<Utc>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64, now: DateTime<Utc>) -> Self {
        TokenBucket { rate, burst, tokens: burst, last: now }
    }

    fn refill(&mut self, now: DateTime<Utc>) {
        let elapsed = (now - self.last).num_milliseconds().max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Changes the rate from `now` on, keeping the tokens earned so far.
    pub fn set_rate(&mut self, rate: f64, now: DateTime<Utc>) {
        self.refill(now);
        self.rate = rate;
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes a token if one is there; never at rate 0.
    pub fn try_take(&mut self, now: DateTime<Utc>) -> bool {
        self.refill(now);
        if self.rate > 0.0 && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token will be there; `None` at rate 0.
    pub fn next_token(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut probe = self.clone();
        probe.refill(now);
        if probe.rate <= 0.0 {
            return None;
        }
        if probe.tokens >= 1.0 {
            return Some(now);
        }
        let seconds = (1.0 - probe.tokens) / probe.rate;
        Some(now + Duration::milliseconds((seconds * 1000.0).ceil() as i64))
    }
}

/// What we saw of one node, by our clock.
#[derive(Clone, Debug)]
struct Health {
    /// When we last saw the node's Lease or heartbeat change (or first
    /// saw the node).
    probed: DateTime<Utc>,
    lease_renew: Option<DateTime<Utc>>,
    heartbeat: Option<DateTime<Utc>>,
}

/// A zone's health, as Kubernetes computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    Normal,
    /// Many nodes not ready: tainting slows down or stops.
    PartialDisruption,
    /// No node ready.
    FullDisruption,
}

/// The controller's memory between passes.
#[derive(Debug)]
pub struct NodeLifecycle {
    config: Config,
    health: BTreeMap<String, Health>,
    /// Zone → the limiter of new NoExecute taints in it.
    zones: BTreeMap<String, TokenBucket>,
    /// (node, taint key) → when we first saw a taint without `timeAdded`.
    taint_seen: BTreeMap<(String, String), DateTime<Utc>>,
}

impl NodeLifecycle {
    pub fn new(config: Config) -> Self {
        NodeLifecycle { config, health: BTreeMap::new(), zones: BTreeMap::new(), taint_seen: BTreeMap::new() }
    }

    fn entry(&mut self, node: &str, now: DateTime<Utc>) -> &mut Health {
        self.health.entry(node.to_string()).or_insert(Health { probed: now, lease_renew: None, heartbeat: None })
    }

    /// A node's Lease seen at `now` (added or updated).
    pub fn observe_lease(&mut self, lease: &Lease, now: DateTime<Utc>) {
        if lease.metadata.namespace.as_deref() != Some(LEASE_NAMESPACE) {
            return;
        }
        let Some(name) = lease.metadata.name.as_deref() else { return };
        let renew = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
        let health = self.entry(name, now);
        if renew.is_some() && renew != health.lease_renew {
            health.lease_renew = renew;
            health.probed = now;
        }
    }

    /// A Node seen at `now` (added or updated): a new heartbeat counts.
    pub fn observe_node(&mut self, node: &Node, now: DateTime<Utc>) {
        let Some(name) = node.metadata.name.as_deref() else { return };
        let heartbeat = ready_condition(node).and_then(|c| c.last_heartbeat_time.as_ref()).map(|t| t.0);
        let health = self.entry(name, now);
        if heartbeat.is_some() && heartbeat != health.heartbeat {
            health.heartbeat = heartbeat;
            health.probed = now;
        }
    }

    /// A Node deleted.
    pub fn forget_node(&mut self, name: &str) {
        self.health.remove(name);
        self.taint_seen.retain(|(node, _), _| node != name);
    }

    /// The health pass over every node at `now`: status and taints.
    pub fn monitor(&mut self, nodes: &[Node], now: DateTime<Utc>) -> Step {
        let mut step = Step::default();
        // Each node's Ready status as it will be after this pass.
        let mut judged: Vec<(&Node, String)> = Vec::new();
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else { continue };
            let probed = self.entry(name, now).probed;
            let stale = now - probed > self.config.node_monitor_grace_period;
            let reported = ready_condition(node).map(|c| c.status.clone());
            let ready =
                if stale { "Unknown".to_string() } else { reported.clone().unwrap_or_else(|| "Unknown".into()) };
            if stale && reported.as_deref() != Some("Unknown") {
                step.actions.push(Action::UpdateStatus(mark_unknown(node, now)));
            } else if !stale {
                let deadline = probed + self.config.node_monitor_grace_period + Duration::milliseconds(1);
                step.wake_at(deadline, now);
            }
            // A node that never reported is not judged until it goes stale.
            if reported.is_some() || stale {
                judged.push((node, ready));
            }
        }
        self.update_rates(&judged, now);
        for (node, ready) in &judged {
            self.taint(node, ready, now, &mut step);
        }
        step
    }

    /// Sets each zone's limiter from its state.
    fn update_rates(&mut self, judged: &[(&Node, String)], now: DateTime<Utc>) {
        let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new(); // zone → (total, not ready)
        for (node, ready) in judged {
            let c = counts.entry(zone(node)).or_default();
            c.0 += 1;
            if ready != "True" {
                c.1 += 1;
            }
        }
        let states: BTreeMap<String, (usize, ZoneState)> =
            counts.into_iter().map(|(z, (total, bad))| (z, (total, self.zone_state(total, bad)))).collect();
        let all_down = !states.is_empty() && states.values().all(|(_, s)| *s == ZoneState::FullDisruption);
        for (zone, (size, state)) in states {
            let rate = match state {
                _ if all_down => 0.0,
                ZoneState::Normal | ZoneState::FullDisruption => self.config.node_eviction_rate,
                ZoneState::PartialDisruption if size > self.config.large_cluster_size_threshold => {
                    self.config.secondary_node_eviction_rate
                }
                ZoneState::PartialDisruption => 0.0,
            };
            let bucket = self.zones.entry(zone).or_insert_with(|| TokenBucket::new(rate, 1.0, now));
            if bucket.rate() != rate {
                bucket.set_rate(rate, now);
            }
        }
    }

    /// Kubernetes' zone state for `total` nodes of which `not_ready` are.
    pub fn zone_state(&self, total: usize, not_ready: usize) -> ZoneState {
        let ready = total - not_ready;
        if ready == 0 && not_ready > 0 {
            ZoneState::FullDisruption
        } else if not_ready > 2 && not_ready as f64 / total as f64 >= self.config.unhealthy_zone_threshold {
            ZoneState::PartialDisruption
        } else {
            ZoneState::Normal
        }
    }

    /// Brings a node's NoExecute taints in line with its Ready status.
    fn taint(&mut self, node: &Node, ready: &str, now: DateTime<Utc>, step: &mut Step) {
        let wanted = match ready {
            "True" => None,
            "False" => Some(NOT_READY_TAINT),
            _ => Some(UNREACHABLE_TAINT),
        };
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let ours = |t: &Taint| t.effect == "NoExecute" && (t.key == NOT_READY_TAINT || t.key == UNREACHABLE_TAINT);
        let present: Vec<&Taint> = taints.iter().filter(|t| ours(t)).collect();
        if present.len() == 1 && wanted == Some(present[0].key.as_str()) || present.is_empty() && wanted.is_none() {
            return;
        }
        let mut next: Vec<Taint> = taints.iter().filter(|t| !ours(t)).cloned().collect();
        if let Some(key) = wanted {
            // A swap between our two taints is not a new eviction; a first
            // taint waits for its zone's token.
            if present.is_empty() {
                let bucket = self.zones.entry(zone(node)).or_insert_with(|| TokenBucket::new(0.0, 1.0, now));
                if !bucket.try_take(now) {
                    if let Some(at) = bucket.next_token(now) {
                        step.wake_at(at, now);
                    }
                    return;
                }
            }
            next.push(Taint { key: key.into(), effect: "NoExecute".into(), time_added: Some(Time(now)), value: None });
        }
        step.actions.push(Action::Patch {
            api_version: "v1".into(),
            kind: "Node".into(),
            namespace: String::new(),
            name: node.metadata.name.clone().unwrap_or_default(),
            patch: json!({"spec": {"taints": next}}),
        });
    }

    /// The taint manager for one node: which of its pods (`pods`: those
    /// bound to it) must go now, and when to look again.
    pub fn evict(&mut self, node: &Node, pods: &[Pod], now: DateTime<Utc>) -> Step {
        let mut step = Step::default();
        let Some(node_name) = node.metadata.name.clone() else { return step };
        let taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.effect == "NoExecute")
            .collect();
        self.taint_seen.retain(|(n, key), _| n != &node_name || taints.iter().any(|t| &t.key == key));
        let mut added: Vec<DateTime<Utc>> = Vec::new();
        for t in &taints {
            let seen = *self.taint_seen.entry((node_name.clone(), t.key.clone())).or_insert(now);
            added.push(t.time_added.as_ref().map_or(seen, |t| t.0));
        }
        if taints.is_empty() {
            return step;
        }
        for pod in pods {
            let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str());
            let finished =
                matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"));
            if !on_node || finished || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
            // The latest instant each taint allows; None: for ever.
            let mut leave: Option<DateTime<Utc>> = None;
            let mut forever = true;
            for (taint, since) in taints.iter().zip(&added) {
                let matching: Vec<&Toleration> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
                let seconds = if matching.is_empty() {
                    match self.default_toleration(taint) {
                        Some(s) => Some(s),
                        None => Some(0),
                    }
                } else if matching.iter().any(|t| t.toleration_seconds.is_none()) {
                    None
                } else {
                    matching.iter().filter_map(|t| t.toleration_seconds).min()
                };
                if let Some(seconds) = seconds {
                    forever = false;
                    let at = *since + Duration::seconds(seconds.max(0));
                    leave = Some(leave.map_or(at, |l| l.min(at)));
                }
            }
            match leave {
                _ if forever => {}
                Some(at) if at <= now => step.actions.push(Action::delete_of(pod, None)),
                Some(at) => step.wake_at(at, now),
                None => {}
            }
        }
        step
    }

    /// The toleration the DefaultTolerationSeconds admission would add.
    fn default_toleration(&self, taint: &Taint) -> Option<i64> {
        match taint.key.as_str() {
            NOT_READY_TAINT => Some(self.config.default_not_ready_toleration_seconds),
            UNREACHABLE_TAINT => Some(self.config.default_unreachable_toleration_seconds),
            _ => None,
        }
    }
}

/// Kubernetes' toleration matching: same effect (or any), and the key
/// equal with an equal value, or `Exists` (an empty key: any key).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => !key.is_empty() && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

fn zone(node: &Node) -> String {
    node.metadata.labels.as_ref().and_then(|l| l.get(ZONE_LABEL).cloned()).unwrap_or_default()
}

/// The node with its kubelet conditions set `Unknown` (resourceVersion
/// kept, for compare-and-swap).
fn mark_unknown(node: &Node, now: DateTime<Utc>) -> serde_json::Value {
    let mut next = node.clone();
    let status = next.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for type_ in CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(Time(now));
            }
            Some(_) => {}
            None => conditions.push(NodeCondition {
                type_: type_.into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_transition_time: Some(Time(now)),
                last_heartbeat_time: None,
            }),
        }
    }
    // A k8s-openapi object always serializes (apiVersion and kind included).
    serde_json::to_value(&next).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use serde_json::Value;

    use super::*;

    fn t(seconds: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::seconds(seconds)
    }

    fn node(name: &str, ready: &str, taints: &[&str]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.resource_version = Some("3".into());
        node.spec = Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|k| Taint {
                        key: k.to_string(),
                        effect: "NoExecute".into(),
                        time_added: Some(Time(t(0))),
                        value: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(Time(t(0))),
                ..Default::default()
            }]),
            ..Default::default()
        });
        node
    }

    /// A node in the same zone that keeps renewing its lease, so the zone
    /// is not wholly down (which stops all tainting).
    fn neighbour(lc: &mut NodeLifecycle, at: i64) -> Node {
        lc.observe_lease(&lease("ok", at), t(at));
        node("ok", "True", &[])
    }

    fn lease(name: &str, renew: i64) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.into());
        lease.metadata.namespace = Some(LEASE_NAMESPACE.into());
        lease.spec = Some(LeaseSpec { renew_time: Some(MicroTime(t(renew))), ..Default::default() });
        lease
    }

    fn pod(name: &str, tolerations: Vec<Toleration>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.spec = Some(PodSpec { node_name: Some("n1".into()), tolerations: Some(tolerations), ..Default::default() });
        pod
    }

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: seconds,
            value: None,
        }
    }

    fn taint_patches(step: &Step) -> Vec<(String, Vec<String>)> {
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::Patch { name, patch, .. } => Some((
                    name.clone(),
                    patch["spec"]["taints"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t["key"].as_str().unwrap().to_string())
                        .collect(),
                )),
                _ => None,
            })
            .collect()
    }

    fn status_updates(step: &Step) -> Vec<&Value> {
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::UpdateStatus(obj) => Some(obj),
                _ => None,
            })
            .collect()
    }

    fn deleted(step: &Step) -> Vec<String> {
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_node_renewing_its_lease_stays_healthy_and_untainted() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "True", &[]);
        lc.observe_node(&n, t(0));
        for s in (10..=120).step_by(10) {
            lc.observe_lease(&lease("n1", s), t(s));
            let step = lc.monitor(std::slice::from_ref(&n), t(s));
            assert!(step.actions.is_empty(), "at {s}: {:?}", step.actions);
        }
    }

    #[test]
    fn a_silent_node_turns_unknown_and_is_tainted_unreachable() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "True", &[]);
        lc.observe_node(&n, t(0));
        lc.observe_lease(&lease("n1", 0), t(0));
        let ok = neighbour(&mut lc, 40);
        let step = lc.monitor(&[n.clone(), ok], t(40));
        assert!(step.actions.is_empty(), "the grace is not over");
        assert_eq!(step.requeue_after, Some(std::time::Duration::from_millis(1)));
        let ok = neighbour(&mut lc, 41);
        let step = lc.monitor(&[n, ok], t(41));
        let status = status_updates(&step);
        assert_eq!(status.len(), 1);
        let ready =
            status[0]["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "Unknown");
        assert_eq!(ready["reason"], "NodeStatusUnknown");
        assert_eq!(ready["message"], "Kubelet stopped posting node status.");
        assert_eq!(status[0]["metadata"]["resourceVersion"], "3");
        assert_eq!(taint_patches(&step), vec![("n1".to_string(), vec![UNREACHABLE_TAINT.to_string()])]);
    }

    #[test]
    fn the_lease_is_judged_by_when_we_saw_it_change_not_its_timestamp() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "True", &[]);
        // The kubelet's clock is an hour behind ours: no matter.
        lc.observe_lease(&lease("n1", -3600), t(0));
        lc.observe_lease(&lease("n1", -3590), t(30));
        assert!(lc.monitor(std::slice::from_ref(&n), t(60)).actions.is_empty());
        // The same renewTime seen again is no renewal.
        lc.observe_lease(&lease("n1", -3590), t(65));
        assert!(!lc.monitor(std::slice::from_ref(&n), t(71)).actions.is_empty());
    }

    #[test]
    fn a_node_reporting_not_ready_is_tainted_not_ready_and_untainted_when_ready() {
        let mut lc = NodeLifecycle::new(Config::default());
        let sick = node("n1", "False", &[]);
        lc.observe_node(&sick, t(0));
        let ok = neighbour(&mut lc, 0);
        let step = lc.monitor(&[sick, ok.clone()], t(1));
        assert!(status_updates(&step).is_empty(), "the kubelet is talking");
        assert_eq!(taint_patches(&step), vec![("n1".to_string(), vec![NOT_READY_TAINT.to_string()])]);
        let healed = node("n1", "True", &[NOT_READY_TAINT]);
        let step = lc.monitor(&[healed, ok], t(2));
        assert_eq!(taint_patches(&step), vec![("n1".to_string(), vec![])]);
    }

    #[test]
    fn a_not_ready_node_going_silent_swaps_its_taint_without_a_token() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "False", &[NOT_READY_TAINT]);
        lc.observe_node(&n, t(0));
        // Its only zone wholly down: no token is ever there, yet the swap happens.
        let step = lc.monitor(std::slice::from_ref(&n), t(50));
        assert_eq!(lc.zones[""].next_token(t(50)), None);
        assert_eq!(taint_patches(&step), vec![("n1".to_string(), vec![UNREACHABLE_TAINT.to_string()])]);
    }

    #[test]
    fn taints_in_a_healthy_zone_come_at_the_eviction_rate() {
        let mut lc = NodeLifecycle::new(Config::default());
        let mut nodes: Vec<Node> = (0..10).map(|i| node(&format!("n{i}"), "True", &[])).collect();
        nodes[0] = node("n0", "False", &[]);
        nodes[1] = node("n1", "False", &[]);
        for n in &nodes {
            lc.observe_node(n, t(0));
        }
        let step = lc.monitor(&nodes, t(1));
        assert_eq!(taint_patches(&step).len(), 1, "one token at first");
        assert_eq!(step.requeue_after, Some(std::time::Duration::from_secs(10)));
        nodes[0] = node("n0", "False", &[NOT_READY_TAINT]);
        assert!(taint_patches(&lc.monitor(&nodes, t(5))).is_empty());
        assert_eq!(
            taint_patches(&lc.monitor(&nodes, t(11))),
            vec![("n1".to_string(), vec![NOT_READY_TAINT.to_string()])]
        );
    }

    #[test]
    fn an_unhealthy_small_zone_stops_tainting_and_a_large_one_slows_down() {
        let config = Config::default();
        let mut lc = NodeLifecycle::new(config.clone());
        assert_eq!(lc.zone_state(10, 6), ZoneState::PartialDisruption);
        assert_eq!(lc.zone_state(10, 5), ZoneState::Normal);
        assert_eq!(lc.zone_state(2, 2), ZoneState::FullDisruption);
        assert_eq!(lc.zone_state(4, 2), ZoneState::Normal, "at least three nodes must fail");
        let nodes: Vec<Node> =
            (0..10).map(|i| node(&format!("n{i}"), if i < 6 { "False" } else { "True" }, &[])).collect();
        for n in &nodes {
            lc.observe_node(n, t(0));
        }
        let step = lc.monitor(&nodes, t(1));
        assert!(taint_patches(&step).is_empty(), "a small unhealthy zone waits: {:?}", step.actions);

        let mut lc = NodeLifecycle::new(Config { large_cluster_size_threshold: 5, ..config });
        let step = lc.monitor(&nodes, t(0));
        assert_eq!(taint_patches(&step).len(), 1);
        assert_eq!(lc.zones[""].next_token(t(0)), Some(t(100)), "0.01 per second");
    }

    #[test]
    fn a_pod_without_toleration_for_a_custom_taint_is_evicted_at_once() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "True", &["example.com/drain"]);
        let step =
            lc.evict(&n, &[pod("plain", vec![]), pod("tolerant", vec![toleration("example.com/drain", None)])], t(1));
        assert_eq!(deleted(&step), vec!["plain".to_string()]);
        assert_eq!(step.requeue_after, None);
    }

    #[test]
    fn an_unreachable_node_evicts_after_the_default_or_the_pods_toleration() {
        let mut lc = NodeLifecycle::new(Config::default());
        let n = node("n1", "Unknown", &[UNREACHABLE_TAINT]);
        let pods = [pod("default", vec![]), pod("short", vec![toleration(UNREACHABLE_TAINT, Some(30))])];
        let step = lc.evict(&n, &pods, t(10));
        assert!(deleted(&step).is_empty());
        assert_eq!(step.requeue_after, Some(std::time::Duration::from_secs(20)));
        assert_eq!(deleted(&lc.evict(&n, &pods, t(30))), vec!["short".to_string()]);
        assert_eq!(deleted(&lc.evict(&n, &pods, t(299))), vec!["short".to_string()]);
        assert_eq!(deleted(&lc.evict(&n, &pods, t(300))), vec!["default".to_string(), "short".to_string()]);
    }

    #[test]
    fn toleration_matching_follows_kubernetes() {
        let taint = Taint { key: "k".into(), value: Some("v".into()), effect: "NoExecute".into(), time_added: None };
        let equal = |value: &str, effect: Option<&str>| Toleration {
            key: Some("k".into()),
            operator: None,
            value: Some(value.into()),
            effect: effect.map(str::to_string),
            toleration_seconds: None,
        };
        assert!(tolerates(&equal("v", None), &taint));
        assert!(tolerates(&equal("v", Some("NoExecute")), &taint));
        assert!(!tolerates(&equal("w", None), &taint));
        assert!(!tolerates(&equal("v", Some("NoSchedule")), &taint));
        let everything = Toleration { operator: Some("Exists".into()), ..Default::default() };
        assert!(tolerates(&everything, &taint));
    }

    #[test]
    fn a_token_bucket_refills_at_its_rate_and_keeps_tokens_across_a_rate_change() {
        let mut bucket = TokenBucket::new(0.5, 1.0, t(0));
        assert!(bucket.try_take(t(0)));
        assert!(!bucket.try_take(t(1)));
        assert_eq!(bucket.next_token(t(1)), Some(t(2)));
        assert!(bucket.try_take(t(2)));
        bucket.set_rate(0.0, t(3));
        assert_eq!(bucket.next_token(t(3)), None);
        assert!(!bucket.try_take(t(100)));
    }
}
