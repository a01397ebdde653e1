//! Conntrack entries a rule change leaves wrong, for UDP, as kube-proxy
//! clears them. NAT is decided on a flow's first packet and kept in
//! conntrack; a TCP connection to an endpoint that went fails and the
//! client reconnects, but a UDP client sending from one port (a DNS
//! resolver, a statsd or syslog client) refreshes its entry with every
//! packet and would keep sending to the gone endpoint for as long as it
//! sends. So, after each sync:
//! - an endpoint gone from a UDP service port: its flows through the
//!   port's addresses and NodePort are deleted;
//! - a UDP service port that had no endpoints and now has some: every flow
//!   to its addresses and NodePort is deleted (sent while nothing served
//!   it, they were never translated).
//!
//! [`stale_flows`] is pure; [`clear`] runs `conntrack -D` for each flow.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use super::model::ServicePort;

/// The flows one `conntrack -D` deletes (always UDP).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flow {
    /// Sent to a cluster or external IP.
    ToAddress {
        /// The address.
        address: Ipv4Addr,
        /// Translated to this endpoint; `None`: to any, or not at all.
        endpoint: Option<Ipv4Addr>,
    },
    /// Sent to a NodePort.
    ToNodePort {
        /// The port.
        node_port: u16,
        /// Translated to this endpoint; `None`: to any, or not at all.
        endpoint: Option<Ipv4Addr>,
    },
}

impl Flow {
    /// `conntrack`'s arguments.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["-D", "-p", "udp"].map(String::from).to_vec();
        let endpoint = match self {
            Flow::ToAddress { address, endpoint } => {
                args.extend(["--orig-dst".to_string(), address.to_string()]);
                endpoint
            }
            Flow::ToNodePort { node_port, endpoint } => {
                args.extend(["--orig-port-dst".to_string(), node_port.to_string()]);
                endpoint
            }
        };
        if let Some(endpoint) = endpoint {
            args.extend(["--dst-nat".to_string(), endpoint.to_string()]);
        }
        args
    }
}

/// The UDP flows that going from `old` to `new` leaves pointing at the wrong place.
pub fn stale_flows(old: &[ServicePort], new: &[ServicePort]) -> BTreeSet<Flow> {
    let udp = |ports: &[ServicePort]| -> BTreeMap<(String, u16), ServicePort> {
        ports.iter().filter(|p| p.protocol == "udp").map(|p| ((p.key.clone(), p.port), p.clone())).collect()
    };
    let (old, new) = (udp(old), udp(new));
    let mut out = BTreeSet::new();
    for (key, was) in &old {
        let now = new.get(key);
        let kept: BTreeSet<Ipv4Addr> = now.iter().flat_map(|p| p.endpoints.iter().map(|e| e.ip)).collect();
        for gone in was.endpoints.iter().map(|e| e.ip).filter(|ip| !kept.contains(ip)) {
            for &address in was.cluster_ips.iter().chain(&was.external_ips) {
                out.insert(Flow::ToAddress { address, endpoint: Some(gone) });
            }
            if let Some(node_port) = was.node_port {
                out.insert(Flow::ToNodePort { node_port, endpoint: Some(gone) });
            }
        }
    }
    for (key, now) in &new {
        let served_before = old.get(key).is_some_and(|p| !p.endpoints.is_empty());
        if served_before || now.endpoints.is_empty() {
            continue;
        }
        for &address in now.cluster_ips.iter().chain(&now.external_ips) {
            out.insert(Flow::ToAddress { address, endpoint: None });
        }
        if let Some(node_port) = now.node_port {
            out.insert(Flow::ToNodePort { node_port, endpoint: None });
        }
    }
    out
}

/// Deletes `flows`; how many deletions ran (matching flows or not).
/// Best effort: a host without the `conntrack` tool is warned about once,
/// and a failure is logged, never fatal to the sync.
pub async fn clear(flows: &BTreeSet<Flow>) -> usize {
    static MISSING: AtomicBool = AtomicBool::new(false);
    let mut done = 0;
    for flow in flows {
        if MISSING.load(Ordering::Relaxed) {
            break;
        }
        let output = tokio::process::Command::new("conntrack")
            .args(flow.args())
            .stdin(std::process::Stdio::null())
            .output()
            .await;
        match output {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                MISSING.store(true, Ordering::Relaxed);
                tracing::warn!("no conntrack tool: UDP flows to endpoints that went are not cleared");
            }
            Err(e) => tracing::warn!(?flow, error = %e, "running conntrack failed"),
            // It exits 1 when nothing matched.
            Ok(out) if out.status.success() || String::from_utf8_lossy(&out.stderr).contains(" 0 flow entries") => {
                done += 1
            }
            Ok(out) => tracing::warn!(
                ?flow,
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "clearing UDP flows failed"
            ),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::super::model::Endpoint;
    use super::*;

    fn dns(endpoints: &[u8]) -> ServicePort {
        ServicePort {
            key: "kube-system/dns:dns".into(),
            protocol: "udp",
            cluster_ips: vec![Ipv4Addr::new(10, 96, 0, 10)],
            external_ips: vec![],
            port: 53,
            node_port: Some(30053),
            affinity_seconds: None,
            external_local: false,
            internal_local: false,
            endpoints: endpoints
                .iter()
                .map(|&last| Endpoint { ip: Ipv4Addr::new(10, 244, 0, last), port: 53, local: false })
                .collect(),
        }
    }

    #[test]
    fn flows_to_a_gone_udp_endpoint_are_cleared_through_every_address_and_the_node_port() {
        let flows = stale_flows(&[dns(&[5, 6])], &[dns(&[6])]);
        let gone = Some(Ipv4Addr::new(10, 244, 0, 5));
        assert_eq!(
            flows.into_iter().collect::<Vec<_>>(),
            vec![
                Flow::ToAddress { address: Ipv4Addr::new(10, 96, 0, 10), endpoint: gone },
                Flow::ToNodePort { node_port: 30053, endpoint: gone },
            ]
        );
        let all_gone = stale_flows(&[dns(&[5])], &[]);
        assert_eq!(all_gone.len(), 2, "the Service itself went: {all_gone:?}");
    }

    #[test]
    fn a_udp_port_that_gets_its_first_endpoint_loses_its_untranslated_flows() {
        let flows = stale_flows(&[dns(&[])], &[dns(&[5])]);
        assert_eq!(
            flows.into_iter().collect::<Vec<_>>(),
            vec![
                Flow::ToAddress { address: Ipv4Addr::new(10, 96, 0, 10), endpoint: None },
                Flow::ToNodePort { node_port: 30053, endpoint: None },
            ]
        );
        assert_eq!(stale_flows(&[], &[dns(&[5])]).len(), 2, "a new Service too");
    }

    #[test]
    fn tcp_and_unchanged_ports_leave_conntrack_alone() {
        assert!(stale_flows(&[dns(&[5, 6])], &[dns(&[5, 6])]).is_empty());
        assert!(stale_flows(&[dns(&[5, 6])], &[dns(&[5, 6, 7])]).is_empty(), "an added endpoint takes new flows only");
        let mut tcp = dns(&[5]);
        tcp.protocol = "tcp";
        let mut tcp_after = tcp.clone();
        tcp_after.endpoints.clear();
        assert!(stale_flows(&[tcp], &[tcp_after]).is_empty());
    }

    #[test]
    fn the_arguments_are_conntracks() {
        let flow =
            Flow::ToAddress { address: Ipv4Addr::new(10, 96, 0, 10), endpoint: Some(Ipv4Addr::new(10, 244, 0, 5)) };
        assert_eq!(flow.args().join(" "), "-D -p udp --orig-dst 10.96.0.10 --dst-nat 10.244.0.5");
        let flow = Flow::ToNodePort { node_port: 30053, endpoint: None };
        assert_eq!(flow.args().join(" "), "-D -p udp --orig-port-dst 30053");
    }
}
