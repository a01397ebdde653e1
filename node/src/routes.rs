//! Routes to the other nodes' pods, host-gw style: for every Node with a
//! `spec.podCIDR` whose InternalIP is on another host, a route to that
//! CIDR via that address. Nodes on this host need none (their bridges
//! already route their CIDRs), and a node whose address is not on a
//! directly connected network cannot be routed this way (the `ip` error
//! is logged and retried, as flannel's host-gw backend does).
//!
//! The routes carry their own protocol number ([`PROTO`]), so the agent
//! finds the ones it made after a restart, and removes those whose node
//! is gone or moved without touching any other route. Several agents on
//! one host compute the same set (the same Nodes, the same local
//! addresses), so they agree. The pure parts (what is wanted, what `ip`
//! printed) are separate from running `ip`, and tested on fixed input.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;
use skiff_client::runtime::informer::Informer;
use skiff_shutdown::Shutdown;

use crate::cni::{self, CniError};

/// The routing protocol number marking Skiff's routes (unassigned in
/// iproute2's `rt_protos`; Calico's 80 and BIRD's 12 are elsewhere).
pub const PROTO: &str = "77";

/// How often the routes are checked even without a Node change: another
/// agent on this host may have removed them on its exit.
const RESYNC: Duration = Duration::from_secs(30);

/// Pod CIDR -> the address of the node holding it.
pub type Routes = BTreeMap<String, IpAddr>;

/// The routes this host wants: every node's pod CIDR via its InternalIP,
/// except nodes at one of `local` (this host's addresses).
pub fn desired<'a>(nodes: impl IntoIterator<Item = &'a Node>, local: &HashSet<IpAddr>) -> Routes {
    let mut routes = Routes::new();
    for node in nodes {
        let Some(cidr) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).filter(|c| !c.is_empty()) else {
            continue;
        };
        let Some(network) = cidr.split('/').next().and_then(|a| a.parse::<IpAddr>().ok()) else { continue };
        let address = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse::<IpAddr>().ok())
            .find(|a| a.is_ipv4() == network.is_ipv4());
        match address {
            Some(via) if !local.contains(&via) && !via.is_loopback() && !via.is_unspecified() => {
                routes.insert(cidr.to_string(), via);
            }
            _ => {}
        }
    }
    routes
}

/// The routes in `ip -j route show proto 77`'s output.
pub fn parse_routes(json: &str) -> Routes {
    let entries: Vec<Value> = serde_json::from_str(json).unwrap_or_default();
    entries
        .iter()
        .filter_map(|r| {
            let via = r["gateway"].as_str()?.parse().ok()?;
            Some((r["dst"].as_str()?.to_string(), via))
        })
        .collect()
}

/// The addresses in `ip -j addr show`'s output.
pub fn parse_addresses(json: &str) -> HashSet<IpAddr> {
    let links: Vec<Value> = serde_json::from_str(json).unwrap_or_default();
    links
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect()
}

/// What to do to go from `installed` to `wanted`: routes to set (added
/// or moved to another node) and routes to remove.
pub fn plan(installed: &Routes, wanted: &Routes) -> (Routes, Vec<String>) {
    let set = wanted.iter().filter(|(cidr, via)| installed.get(*cidr) != Some(via)).map(|(c, v)| (c.clone(), *v));
    let remove = installed.keys().filter(|cidr| !wanted.contains_key(*cidr)).cloned().collect();
    (set.collect(), remove)
}

/// Skiff's routes on this host now.
pub async fn installed() -> Result<Routes, CniError> {
    cni::ip_output(&["-j", "route", "show", "proto", PROTO]).await.map(|out| parse_routes(&out))
}

/// This host's addresses. None read is an error, not an empty set: every
/// node of this host would look remote, and a route via its own address
/// would replace its bridge's.
pub async fn local_addresses() -> Result<HashSet<IpAddr>, CniError> {
    let out = cni::ip_output(&["-j", "addr", "show"]).await?;
    let addresses = parse_addresses(&out);
    if addresses.is_empty() {
        return Err(CniError::Ip { args: "-j addr show".into(), message: "no address could be read".into() });
    }
    Ok(addresses)
}

/// Brings this host's routes to what `nodes` want; each failure is
/// logged and the rest still applied.
pub async fn reconcile<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Result<(), CniError> {
    let wanted = desired(nodes, &local_addresses().await?);
    let (set, remove) = plan(&installed().await?, &wanted);
    for (cidr, via) in set {
        let via = via.to_string();
        match cni::ip(&["route", "replace", &cidr, "via", &via, "proto", PROTO]).await {
            Ok(()) => tracing::info!(%cidr, %via, "route to a node's pods"),
            Err(e) => tracing::warn!(%cidr, %via, error = %e, "cannot route to a node's pods"),
        }
    }
    for cidr in remove {
        match cni::ip(&["route", "del", &cidr, "proto", PROTO]).await {
            Ok(()) => tracing::info!(%cidr, "route to a node's pods removed"),
            Err(e) => tracing::warn!(%cidr, error = %e, "removing a route to a node's pods"),
        }
    }
    Ok(())
}

/// Removes every route Skiff made on this host (on `--remove-pods-on-exit`).
pub async fn remove_all() -> Result<usize, CniError> {
    let routes = installed().await?;
    for cidr in routes.keys() {
        cni::ip(&["route", "del", cidr, "proto", PROTO]).await?;
    }
    Ok(routes.len())
}

/// Keeps the routes in step with the Nodes until `shutdown`.
pub async fn run(nodes: Informer<Node>, shutdown: Shutdown) {
    let mut changes = nodes.subscribe();
    let store = nodes.store();
    tokio::select! {
        _ = shutdown.cancelled() => return,
        ready = store.wait_until_ready() => if ready.is_err() { return },
    }
    loop {
        let all: Vec<Arc<Node>> = store.list();
        if let Err(e) = reconcile(all.iter().map(|n| n.as_ref())).await {
            tracing::warn!(error = %e, "reading this host's routes");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(RESYNC) => {}
            changed = changes.recv() => {
                if changed.is_none() {
                    return;
                }
                // A burst of changes (a relist) makes one pass: whatever
                // arrives while it runs is read from the store anyway.
                tokio::time::sleep(Duration::from_millis(200)).await;
                while let Some(Some(_)) = changes.recv().now_or_never() {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidr: &str, addresses: &[(&str, &str)]) -> Node {
        let addresses: Vec<Value> = addresses.iter().map(|(t, a)| json!({"type": t, "address": a})).collect();
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"podCIDR": cidr},
            "status": {"addresses": addresses}}))
        .unwrap()
    }

    #[test]
    fn each_remote_node_is_routed_via_its_internal_ip_and_local_ones_are_not() {
        let local: HashSet<IpAddr> = ["127.0.0.1", "192.0.2.2"].iter().map(|a| a.parse().unwrap()).collect();
        let nodes = [
            node("here", "10.244.1.0/24", &[("InternalIP", "192.0.2.2")]),
            node("there", "10.244.2.0/24", &[("Hostname", "there"), ("InternalIP", "192.0.2.7")]),
            node("no-cidr", "", &[("InternalIP", "192.0.2.8")]),
            node("no-address", "10.244.4.0/24", &[("Hostname", "x")]),
            node("loopback", "10.244.5.0/24", &[("InternalIP", "127.0.0.2")]),
            node("dual", "fd00:244:6::/64", &[("InternalIP", "192.0.2.9"), ("InternalIP", "fd00::9")]),
        ];
        let wanted = desired(&nodes, &local);
        let expected: Routes = [("10.244.2.0/24", "192.0.2.7"), ("fd00:244:6::/64", "fd00::9")]
            .iter()
            .map(|(c, a)| (c.to_string(), a.parse().unwrap()))
            .collect();
        assert_eq!(wanted, expected);
    }

    #[test]
    fn the_plan_sets_new_and_moved_routes_and_removes_stale_ones() {
        let routes = |pairs: &[(&str, &str)]| -> Routes {
            pairs.iter().map(|(c, a)| (c.to_string(), a.parse().unwrap())).collect()
        };
        let installed =
            routes(&[("10.244.2.0/24", "192.0.2.7"), ("10.244.3.0/24", "192.0.2.8"), ("10.244.9.0/24", "192.0.2.9")]);
        let wanted =
            routes(&[("10.244.2.0/24", "192.0.2.7"), ("10.244.3.0/24", "192.0.2.5"), ("10.244.4.0/24", "192.0.2.6")]);
        let (set, remove) = plan(&installed, &wanted);
        assert_eq!(set, routes(&[("10.244.3.0/24", "192.0.2.5"), ("10.244.4.0/24", "192.0.2.6")]));
        assert_eq!(remove, vec!["10.244.9.0/24".to_string()]);
        assert_eq!(plan(&wanted, &wanted), (Routes::new(), vec![]));
    }

    #[test]
    fn ip_json_output_parses_into_routes_and_addresses() {
        let routes = r#"[{"dst":"10.244.2.0/24","gateway":"192.0.2.7","dev":"eth0","protocol":"77","flags":[]},
            {"type":"blackhole","dst":"10.244.0.0/16","flags":[]}]"#;
        let parsed = parse_routes(routes);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed["10.244.2.0/24"], "192.0.2.7".parse::<IpAddr>().unwrap());
        assert!(parse_routes("").is_empty());
        let addrs = r#"[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
            {"ifindex":2,"ifname":"eth0","addr_info":[{"family":"inet","local":"192.0.2.2"},{"family":"inet6","local":"fd00::2"}]}]"#;
        let parsed = parse_addresses(addrs);
        assert_eq!(parsed.len(), 3);
        assert!(parsed.contains(&"fd00::2".parse().unwrap()));
    }
}
