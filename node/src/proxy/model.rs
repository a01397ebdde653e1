//! What the proxy programs, read from the Services and EndpointSlices:
//! one [`ServicePort`] per port of every Service with a cluster IP, with
//! the endpoints that may take its traffic. Pure: tested on fixed objects.
//!
//! Endpoints are chosen as kube-proxy's `CategorizeEndpoints` does: the
//! ready ones; when none is ready, the serving ones that are terminating,
//! so a Service whose pods are all shutting down drains instead of
//! refusing connections; never the ones that are neither.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_SECONDS: i32 = 10_800;

/// One port of one Service, as the rules need it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServicePort {
    /// `namespace/name:port-name` (`namespace/name` for an unnamed port),
    /// the key of its chains.
    pub key: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    /// The cluster IPs (IPv4 only: the rules are iptables', not ip6tables').
    pub cluster_ips: Vec<Ipv4Addr>,
    /// `spec.externalIPs` and, for a LoadBalancer, its ingress IPs
    /// (`status.loadBalancer.ingress`, unless `ipMode: Proxy`): traffic
    /// from outside the cluster, served as the NodePort is.
    pub external_ips: Vec<Ipv4Addr>,
    /// The service port.
    pub port: u16,
    /// The NodePort, for NodePort and LoadBalancer Services.
    pub node_port: Option<u16>,
    /// `sessionAffinity: ClientIP`: for how long a client sticks to its endpoint.
    pub affinity_seconds: Option<i32>,
    /// `externalTrafficPolicy: Local`: NodePort traffic only to this node's
    /// endpoints, with the client's source address kept.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: cluster IP traffic only to this node's endpoints.
    pub internal_local: bool,
    /// The endpoints that may take traffic, sorted.
    pub endpoints: Vec<Endpoint>,
}

/// One endpoint of a [`ServicePort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The pod's address.
    pub ip: Ipv4Addr,
    /// The port on the pod.
    pub port: u16,
    /// On this node.
    pub local: bool,
}

impl ServicePort {
    /// The endpoints for traffic from pods and the host (the cluster IP).
    pub fn cluster_endpoints(&self) -> Vec<Endpoint> {
        if self.internal_local {
            self.local_endpoints()
        } else {
            self.endpoints.clone()
        }
    }

    /// The endpoints on this node.
    pub fn local_endpoints(&self) -> Vec<Endpoint> {
        self.endpoints.iter().filter(|e| e.local).copied().collect()
    }
}

/// The endpoint with its conditions, before the choice.
#[derive(Clone, Copy)]
struct Candidate {
    endpoint: Endpoint,
    ready: bool,
    serving_terminating: bool,
}

/// Every service port with a cluster IP, with its endpoints for `node`.
pub fn service_ports(services: &[Arc<Service>], slices: &[Arc<EndpointSlice>], node: &str) -> Vec<ServicePort> {
    // (namespace, service) -> the slices' endpoints, by port name and protocol.
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        let Some(service) = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else { continue };
        let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
        by_service.entry((namespace, service.as_str())).or_default().push(slice);
    }
    let mut out = Vec::new();
    for service in services {
        let (Some(namespace), Some(name)) = (service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
        else {
            continue;
        };
        let Some(spec) = service.spec.as_ref() else { continue };
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        if type_ == "ExternalName" {
            continue;
        }
        let mut cluster_ips: Vec<Ipv4Addr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| ip.parse().ok())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        cluster_ips.sort();
        if cluster_ips.is_empty() {
            // Headless: DNS answers with the pods themselves.
            continue;
        }
        let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        let ingress = ingress
            .into_iter()
            .flatten()
            .filter(|_| type_ == "LoadBalancer")
            // `Proxy`: the load balancer reaches the nodes itself; traffic
            // to its address must go to it, not be short-cut here.
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.as_ref());
        let external_ips: Vec<Ipv4Addr> = spec
            .external_ips
            .iter()
            .flatten()
            .chain(ingress)
            .filter_map(|ip| ip.parse().ok())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .unwrap_or(DEFAULT_AFFINITY_SECONDS)
        });
        let slices = by_service.get(&(namespace, name)).map(Vec::as_slice).unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            let Ok(service_port) = u16::try_from(port.port) else { continue };
            let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
                "UDP" => "udp",
                "SCTP" => "sctp",
                _ => "tcp",
            };
            let port_name = port.name.clone().unwrap_or_default();
            let node_port = matches!(type_, "NodePort" | "LoadBalancer")
                .then(|| port.node_port.and_then(|p| u16::try_from(p).ok()))
                .flatten()
                .filter(|p| *p != 0);
            out.push(ServicePort {
                key: match port_name.as_str() {
                    "" => format!("{namespace}/{name}"),
                    named => format!("{namespace}/{name}:{named}"),
                },
                protocol,
                cluster_ips: cluster_ips.clone(),
                external_ips: external_ips.clone(),
                port: service_port,
                node_port,
                affinity_seconds,
                external_local: (node_port.is_some() || !external_ips.is_empty())
                    && spec.external_traffic_policy.as_deref() == Some("Local"),
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                endpoints: choose(candidates(slices, &port_name, port.protocol.as_deref().unwrap_or("TCP"), node)),
            });
        }
    }
    out.sort();
    out
}

/// The slices' endpoints for the port named `port_name`, deduplicated.
fn candidates(slices: &[&EndpointSlice], port_name: &str, protocol: &str, node: &str) -> Vec<Candidate> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for slice in slices {
        let port = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == port_name && p.protocol.as_deref().unwrap_or("TCP") == protocol
        });
        let Some(port) = port.and_then(|p| p.port).and_then(|p| u16::try_from(p).ok()) else { continue };
        for endpoint in &slice.endpoints {
            let conditions = endpoint.conditions.as_ref();
            // Unset conditions read as ready and serving, as Kubernetes says.
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            let local = endpoint.node_name.as_deref() == Some(node);
            for address in &endpoint.addresses {
                let Ok(ip) = address.parse::<Ipv4Addr>() else { continue };
                if seen.insert((ip, port)) {
                    let endpoint = Endpoint { ip, port, local };
                    out.push(Candidate { endpoint, ready, serving_terminating: serving && terminating });
                }
            }
        }
    }
    out
}

/// The ready endpoints, or the serving terminating ones when none is ready.
fn choose(candidates: Vec<Candidate>) -> Vec<Endpoint> {
    let ready: Vec<Endpoint> = candidates.iter().filter(|c| c.ready).map(|c| c.endpoint).collect();
    let mut chosen = if ready.is_empty() {
        candidates.iter().filter(|c| c.serving_terminating).map(|c| c.endpoint).collect()
    } else {
        ready
    };
    chosen.sort();
    chosen
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn service(value: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(value).expect("a Service"))
    }

    pub fn slice(value: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(serde_json::from_value(value).expect("an EndpointSlice"))
    }

    fn web() -> Arc<Service> {
        service(json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"], "type": "NodePort",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]}
        }))
    }

    fn web_slice() -> Arc<EndpointSlice> {
        slice(json!({
            "metadata": {"namespace": "default", "name": "web-abc", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true}, "nodeName": "n1"},
                {"addresses": ["10.244.2.5"], "conditions": {"ready": true}, "nodeName": "n2"},
                {"addresses": ["10.244.1.6"], "conditions": {"ready": false, "serving": false}, "nodeName": "n1"},
                {"addresses": ["10.244.2.7"], "conditions": {"ready": false, "serving": true, "terminating": true}, "nodeName": "n2"},
            ]
        }))
    }

    #[test]
    fn each_port_gets_its_ready_endpoints_with_the_slices_port_of_its_name() {
        let ports = service_ports(&[web()], &[web_slice()], "n1");
        assert_eq!(ports.len(), 2);
        let http = ports.iter().find(|p| p.key == "default/web:http").expect("http");
        assert_eq!((http.protocol, http.port, http.node_port), ("tcp", 80, Some(30080)));
        assert_eq!(http.cluster_ips, vec![Ipv4Addr::new(10, 96, 0, 20)]);
        let endpoints: Vec<_> = http.endpoints.iter().map(|e| (e.ip.to_string(), e.port, e.local)).collect();
        assert_eq!(endpoints, vec![("10.244.1.5".into(), 8080, true), ("10.244.2.5".into(), 8080, false)]);
        let dns = ports.iter().find(|p| p.key == "default/web:dns").expect("dns");
        assert_eq!((dns.protocol, dns.node_port), ("udp", None), "NodePorts only where the Service has one");
        assert!(dns.endpoints.iter().all(|e| e.port == 5353));
    }

    #[test]
    fn serving_terminating_endpoints_take_traffic_only_when_none_is_ready() {
        let mut draining = (*web_slice()).clone();
        for endpoint in &mut draining.endpoints {
            if let Some(c) = endpoint.conditions.as_mut() {
                c.ready = Some(false);
            }
        }
        let ports = service_ports(&[web()], &[Arc::new(draining)], "n1");
        let ips: Vec<String> = ports[1].endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(ips, vec!["10.244.2.7"], "only the serving terminating one: {ports:?}");
    }

    #[test]
    fn headless_external_name_and_unnamed_ports_are_handled_as_kube_proxy_does() {
        let headless = service(json!({
            "metadata": {"namespace": "default", "name": "db"},
            "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}
        }));
        let external = service(json!({
            "metadata": {"namespace": "default", "name": "ext"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}
        }));
        let single = service(json!({
            "metadata": {"namespace": "ns", "name": "one"},
            "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 443, "targetPort": "https"}],
                     "sessionAffinity": "ClientIP", "internalTrafficPolicy": "Local"}
        }));
        let single_slice = slice(json!({
            "metadata": {"namespace": "ns", "name": "one-x", "labels": {SERVICE_NAME_LABEL: "one"}},
            "addressType": "IPv4",
            "ports": [{"port": 8443}],
            "endpoints": [{"addresses": ["10.244.1.9"], "nodeName": "n2"}]
        }));
        let ports = service_ports(&[headless, external, single], &[single_slice], "n1");
        assert_eq!(ports.len(), 1, "{ports:?}");
        let one = &ports[0];
        assert_eq!(one.key, "ns/one");
        assert_eq!(one.affinity_seconds, Some(DEFAULT_AFFINITY_SECONDS));
        assert_eq!(one.endpoints.len(), 1, "conditions unset read as ready");
        assert!(one.cluster_endpoints().is_empty(), "internalTrafficPolicy Local: the only endpoint is elsewhere");
    }

    #[test]
    fn a_load_balancers_ingress_ips_are_external_ips_unless_proxied() {
        let balancer = |type_: &str, ingress: serde_json::Value| {
            service(json!({
                "metadata": {"namespace": "default", "name": "web"},
                "spec": {"clusterIP": "10.96.0.20", "type": type_, "externalTrafficPolicy": "Local",
                         "externalIPs": ["192.0.2.50"],
                         "ports": [{"name": "http", "port": 80, "nodePort": 30080}]},
                "status": {"loadBalancer": {"ingress": ingress}}
            }))
        };
        let ingress = json!([{"ip": "192.0.2.7", "ipMode": "VIP"}, {"ip": "192.0.2.8"},
                             {"ip": "198.51.100.1", "ipMode": "Proxy"}, {"hostname": "lb.example.com"}]);
        let ports = service_ports(&[balancer("LoadBalancer", ingress.clone())], &[web_slice()], "n1");
        let external: Vec<String> = ports[0].external_ips.iter().map(Ipv4Addr::to_string).collect();
        assert_eq!(external, ["192.0.2.7", "192.0.2.8", "192.0.2.50"]);
        assert!(ports[0].external_local, "externalTrafficPolicy applies to them");
        // A stale ingress on a Service that is no longer a LoadBalancer.
        let ports = service_ports(&[balancer("ClusterIP", ingress)], &[web_slice()], "n1");
        let external: Vec<String> = ports[0].external_ips.iter().map(Ipv4Addr::to_string).collect();
        assert_eq!(external, ["192.0.2.50"]);
        assert!(ports[0].external_local, "an external IP is reached from outside too");
    }

    #[test]
    fn a_target_port_no_pod_has_leaves_the_service_without_endpoints() {
        let empty = slice(json!({
            "metadata": {"namespace": "default", "name": "web-abc", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": []
        }));
        let ports = service_ports(&[web()], &[empty], "n1");
        assert!(ports.iter().all(|p| p.endpoints.is_empty()));
    }
}
