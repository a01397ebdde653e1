//! The service load balancer, as k3s's ServiceLB: a Service of type
//! `LoadBalancer` is reachable on its port at the address of every Ready
//! node, and its `status.loadBalancer.ingress` says so, so `kubectl get
//! svc` shows those addresses as its EXTERNAL-IP instead of `<pending>`.
//!
//! k3s gets there with a DaemonSet of pods holding host ports; Skiff's
//! service proxy already holds every node's addresses, so it needs no pod:
//! this controller publishes the addresses, and every node's proxy sends
//! traffic to an ingress IP and the service port into the Service, as it
//! does for `spec.externalIPs` (with `ipMode: VIP`, which is what that
//! tells kube-proxy to do).
//!
//! A node counts while its `Ready` condition is `True` and it does not
//! carry `node.kubernetes.io/exclude-from-external-load-balancers`; its
//! address is its ExternalIP, else its InternalIP (IPv4: the proxy's
//! rules are). A Service naming a `spec.loadBalancerClass` belongs to
//! another implementation and is left alone; one that is no longer of
//! type `LoadBalancer` loses the ingress this controller gave it.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::json;

use crate::action::Action;

/// Nodes carrying this label (any value) are never a Service's ingress.
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The addresses a LoadBalancer Service is published at, sorted.
pub fn ingress_ips<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<Ipv4Addr> {
    let mut out = BTreeSet::new();
    for node in nodes {
        if node.metadata.deletion_timestamp.is_some()
            || node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(EXCLUDE_LABEL))
        {
            continue;
        }
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            continue;
        }
        let addresses = status.and_then(|s| s.addresses.as_deref()).unwrap_or_default();
        let ipv4 =
            |kind: &str| addresses.iter().filter(|a| a.type_ == kind).find_map(|a| a.address.parse::<Ipv4Addr>().ok());
        if let Some(ip) = ipv4("ExternalIP").or_else(|| ipv4("InternalIP")) {
            out.insert(ip);
        }
    }
    out.into_iter().collect()
}

/// The status write (and Event) that brings `service` to `ingress`, the
/// current [`ingress_ips`]; nothing when it is there already.
pub fn reconcile(service: &Service, ingress: &[Ipv4Addr]) -> Vec<Action> {
    let spec = service.spec.as_ref();
    let load_balancer = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    if spec.and_then(|s| s.load_balancer_class.as_deref()).is_some() {
        return vec![];
    }
    let current: Vec<(&str, Option<&str>)> = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|i| (i.ip.as_deref().unwrap_or_default(), i.ip_mode.as_deref()))
        .collect();
    let wanted: Vec<String> = if load_balancer { ingress.iter().map(Ipv4Addr::to_string).collect() } else { vec![] };
    let same = current.len() == wanted.len()
        && current.iter().zip(&wanted).all(|((ip, mode), want)| ip == want && *mode == Some("VIP"));
    if same {
        return vec![];
    }
    let mut updated = serde_json::to_value(service).unwrap_or_default();
    updated["apiVersion"] = json!("v1");
    updated["kind"] = json!("Service");
    let entries: Vec<_> = wanted.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect();
    updated["status"]["loadBalancer"] = if entries.is_empty() { json!({}) } else { json!({"ingress": entries}) };
    let mut actions = vec![Action::UpdateStatus(updated)];
    if load_balancer {
        let message = match wanted.as_slice() {
            [] => "no Ready node to publish the Service at".to_string(),
            ips => format!("published at the Ready nodes' addresses: {}", ips.join(", ")),
        };
        let (type_, reason) =
            if wanted.is_empty() { ("Warning", "NoReadyNodes") } else { ("Normal", "EnsuredLoadBalancer") };
        actions.push(Action::event_about(service, type_, reason, message));
    }
    actions
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeCondition, NodeStatus, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str, ready: &str, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn service(type_: &str, ingress: &[&str]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                resource_version: Some("9".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec { type_: Some(type_.into()), ..Default::default() }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ingress
                            .iter()
                            .map(|ip| LoadBalancerIngress {
                                ip: Some(ip.to_string()),
                                ip_mode: Some("VIP".into()),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn ready_nodes_are_published_by_external_else_internal_ipv4_address() {
        let mut excluded = node("excluded", "True", &[("InternalIP", "192.0.2.9")]);
        excluded.metadata.labels = Some(BTreeMap::from([(EXCLUDE_LABEL.to_string(), String::new())]));
        let nodes = [
            node("b", "True", &[("InternalIP", "192.0.2.7"), ("Hostname", "b")]),
            node("a", "True", &[("InternalIP", "10.0.0.5"), ("ExternalIP", "198.51.100.5")]),
            node("down", "False", &[("InternalIP", "192.0.2.8")]),
            node("unknown", "Unknown", &[("InternalIP", "192.0.2.10")]),
            node("v6", "True", &[("InternalIP", "fd00::1")]),
            node("twin", "True", &[("InternalIP", "192.0.2.7")]),
            excluded,
        ];
        let ips: Vec<String> = ingress_ips(&nodes).iter().map(Ipv4Addr::to_string).collect();
        assert_eq!(ips, ["192.0.2.7", "198.51.100.5"]);
    }

    #[test]
    fn a_load_balancer_gets_the_nodes_and_is_left_alone_once_it_has_them() {
        let ips: Vec<Ipv4Addr> = vec!["192.0.2.7".parse().unwrap(), "192.0.2.8".parse().unwrap()];
        let mut pending = service("LoadBalancer", &[]);
        pending.status = None;
        let actions = reconcile(&pending, &ips);
        let [Action::UpdateStatus(updated), Action::Event { reason, message, .. }] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        assert_eq!(
            updated["status"]["loadBalancer"],
            json!({"ingress": [{"ip": "192.0.2.7", "ipMode": "VIP"}, {"ip": "192.0.2.8", "ipMode": "VIP"}]})
        );
        assert_eq!(updated["metadata"]["resourceVersion"], "9", "a compare-and-swap on the cached version");
        assert_eq!((updated["kind"].as_str(), updated["apiVersion"].as_str()), (Some("Service"), Some("v1")));
        assert_eq!(reason, "EnsuredLoadBalancer");
        assert!(message.contains("192.0.2.7, 192.0.2.8"), "{message}");

        assert!(reconcile(&service("LoadBalancer", &["192.0.2.7", "192.0.2.8"]), &ips).is_empty());
        // A node went: its address goes from the status.
        let actions = reconcile(&service("LoadBalancer", &["192.0.2.7", "192.0.2.8"]), &ips[..1]);
        let [Action::UpdateStatus(updated), _] = actions.as_slice() else { panic!("{actions:?}") };
        assert_eq!(updated["status"]["loadBalancer"]["ingress"], json!([{"ip": "192.0.2.7", "ipMode": "VIP"}]));
        // No node at all: pending, and said so.
        let actions = reconcile(&service("LoadBalancer", &["192.0.2.7"]), &[]);
        let [Action::UpdateStatus(updated), Action::Event { type_, .. }] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        assert_eq!(updated["status"]["loadBalancer"], json!({}));
        assert_eq!(type_, "Warning");
    }

    #[test]
    fn other_types_lose_the_ingress_and_another_class_is_not_ours() {
        let ips: Vec<Ipv4Addr> = vec!["192.0.2.7".parse().unwrap()];
        let actions = reconcile(&service("ClusterIP", &["192.0.2.7"]), &ips);
        let [Action::UpdateStatus(updated)] = actions.as_slice() else { panic!("{actions:?}") };
        assert_eq!(updated["status"]["loadBalancer"], json!({}));
        assert!(reconcile(&service("NodePort", &[]), &ips).is_empty());

        let mut classed = service("LoadBalancer", &[]);
        classed.spec.as_mut().unwrap().load_balancer_class = Some("example.com/metal".into());
        assert!(reconcile(&classed, &ips).is_empty());
    }
}
