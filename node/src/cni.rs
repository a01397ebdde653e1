//! The node's pod network: a CNI conflist for its pod CIDR that
//! containerd's CRI plugin runs for every sandbox, and the host routes and
//! links around it.
//!
//! The conflist chains `bridge` (a bridge per node, named from a hash of
//! the node's name so several nodes on one host never share one; the
//! gateway is the bridge; hairpin so a pod reaches itself through a
//! Service) with `host-local` IPAM on the pod CIDR (its allocations kept
//! under the node's data dir, not the host-wide `/var/lib/cni`) and
//! `portmap` for hostPorts. The loopback interface is containerd's: its CRI
//! plugin brings `lo` up with the `loopback` plugin from the same bin dir.

use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

/// The conflist's file name; containerd loads the first file by name.
pub const CONFLIST_FILE: &str = "10-skiff.conflist";
/// The network's name in the conflist.
pub const NETWORK_NAME: &str = "skiff";
/// Where Debian's `containernetworking-plugins` puts the plugins.
pub const DEFAULT_CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The whole pod range (the node IPAM controller's default cluster CIDR).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Service range.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// Why a network change failed.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// Writing the config.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The io error.
        source: std::io::Error,
    },
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {message}")]
    Ip {
        /// Its arguments.
        args: String,
        /// Its error output.
        message: String,
    },
}

/// Every pod bridge's name starts with this (`skiff+` in iptables matches them all).
pub const BRIDGE_PREFIX: &str = "skiff";

/// The bridge of the node named `node`: `skiff` and 8 hex digits of the
/// name's SHA-256 (13 characters; Linux allows 15).
pub fn bridge_name(node: &str) -> String {
    let digest = format!("{:x}", Sha256::digest(node.as_bytes()));
    format!("{BRIDGE_PREFIX}{}", &digest[..8])
}

/// The node's CNI network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniConfig {
    /// The node's name (the bridge is named from it).
    pub node_name: String,
    /// The node's pod CIDR, e.g. `10.244.1.0/24`.
    pub pod_cidr: String,
    /// Where host-local keeps its allocations (under the node's data dir).
    pub ipam_data_dir: PathBuf,
}

impl CniConfig {
    /// The bridge's name.
    pub fn bridge(&self) -> String {
        bridge_name(&self.node_name)
    }

    /// The conflist's JSON.
    pub fn conflist(&self) -> serde_json::Value {
        json!({
            "cniVersion": "1.0.0",
            "name": NETWORK_NAME,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge(),
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.pod_cidr }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": self.ipam_data_dir.to_string_lossy(),
                    },
                },
                {
                    "type": "portmap",
                    "capabilities": { "portMappings": true },
                },
            ],
        })
    }

    /// Writes the conflist into `conf_dir` (through a renamed temporary
    /// file: containerd watches the directory); returns its path.
    pub fn write(&self, conf_dir: &Path) -> Result<PathBuf, CniError> {
        let io = |what: String| move |source| CniError::Io { what, source };
        std::fs::create_dir_all(conf_dir).map_err(io(format!("creating {}", conf_dir.display())))?;
        std::fs::create_dir_all(&self.ipam_data_dir)
            .map_err(io(format!("creating {}", self.ipam_data_dir.display())))?;
        let path = conf_dir.join(CONFLIST_FILE);
        let partial = conf_dir.join(format!(".{CONFLIST_FILE}.partial"));
        let text = serde_json::to_string_pretty(&self.conflist()).unwrap_or_default();
        std::fs::write(&partial, text).map_err(io(format!("writing {}", partial.display())))?;
        std::fs::rename(&partial, &path).map_err(io(format!("renaming {}", path.display())))?;
        Ok(path)
    }
}

/// The gateway host-local gives a pod CIDR's pods: its first address
/// (the bridge's own), e.g. 10.244.7.1 for 10.244.7.0/24.
pub fn gateway_of(pod_cidr: &str) -> Option<std::net::IpAddr> {
    let (network, bits) = pod_cidr.split_once('/')?;
    let network: std::net::Ipv4Addr = network.parse().ok()?;
    let bits: u32 = bits.parse().ok().filter(|b| *b <= 30)?;
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    Some(std::net::Ipv4Addr::from((u32::from(network) & mask) + 1).into())
}

/// Runs `ip ARGS`.
pub(crate) async fn ip(args: &[&str]) -> Result<(), CniError> {
    ip_output(args).await.map(|_| ())
}

/// Runs `ip ARGS` and returns what it printed.
pub(crate) async fn ip_output(args: &[&str]) -> Result<String, CniError> {
    let output = tokio::process::Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| CniError::Io { what: "running ip".to_string(), source })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(CniError::Ip {
        args: args.join(" "),
        message: String::from_utf8_lossy(&output.stderr).trim().replace('\n', "; "),
    })
}

/// Adds (or keeps) a blackhole route for each range, e.g. [`CLUSTER_CIDR`]
/// and [`SERVICE_CIDR`]: traffic to an address nothing on this host owns
/// is dropped instead of leaving by the default route. Each node's bridge
/// route (its /24) is more specific and wins.
pub async fn add_blackhole_routes(cidrs: &[&str]) -> Result<(), CniError> {
    for cidr in cidrs {
        ip(&["route", "replace", "blackhole", cidr]).await?;
    }
    Ok(())
}

/// The host's end of the service range's sink: a veth whose peer
/// ([`SERVICE_SINK_PEER`]) stays down, so whatever is sent into it is
/// dropped.
pub const SERVICE_SINK: &str = "skiff-svc";
/// The sink's other end, never brought up.
pub const SERVICE_SINK_PEER: &str = "skiff-svc-end";

/// Routes `cidr` (the Service range, [`SERVICE_CIDR`]) into
/// [`SERVICE_SINK`], made if missing: nothing addressed to the range
/// leaves the machine, yet, unlike a blackhole or `unreachable` route,
/// the route exists, so the host's own connections to a cluster IP get
/// past `connect()` to the `nat` table's OUTPUT chain, whose DNAT then
/// sends them to an endpoint (the kernel routes them again after the
/// translation). A cluster IP no Service holds goes into the sink and
/// times out, as it would through a default route; a Service with no
/// endpoints is rejected in the `filter` table, which comes after
/// routing. Several agents on one host share the sink.
pub async fn add_service_sink(cidr: &str) -> Result<(), CniError> {
    match ip(&["link", "add", SERVICE_SINK, "type", "veth", "peer", "name", SERVICE_SINK_PEER]).await {
        Err(CniError::Ip { message, .. }) if message.contains("File exists") => {}
        other => other?,
    }
    ip(&["link", "set", SERVICE_SINK, "arp", "off", "up"]).await?;
    ip(&["route", "replace", cidr, "dev", SERVICE_SINK]).await
}

/// Removes the blackhole routes [`add_blackhole_routes`] added; a missing
/// one is fine.
pub async fn delete_blackhole_routes(cidrs: &[&str]) -> Result<(), CniError> {
    for cidr in cidrs {
        match ip(&["route", "del", "blackhole", cidr]).await {
            Err(CniError::Ip { message, .. }) if message.contains("No such process") => {}
            other => other?,
        }
    }
    Ok(())
}

/// Deletes a node's bridge (on cleanup, after its sandboxes are gone); a
/// missing bridge is fine.
pub async fn delete_bridge(name: &str) -> Result<(), CniError> {
    match ip(&["link", "delete", name, "type", "bridge"]).await {
        Err(CniError::Ip { message, .. }) if message.contains("Cannot find device") => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CniConfig {
        CniConfig {
            node_name: "node-1".into(),
            pod_cidr: "10.244.7.0/24".into(),
            ipam_data_dir: PathBuf::from("/data/node-1/cni/ipam"),
        }
    }

    #[test]
    fn the_gateway_is_the_first_address_of_the_pod_cidr() {
        assert_eq!(gateway_of("10.244.7.0/24"), Some("10.244.7.1".parse().unwrap()));
        assert_eq!(gateway_of("10.244.7.9/24"), Some("10.244.7.1".parse().unwrap()));
        assert_eq!(gateway_of("10.244.0.0/16"), Some("10.244.0.1".parse().unwrap()));
        assert_eq!(gateway_of("10.244.7.0/31"), None, "no room for pods");
        assert_eq!(gateway_of("fd00::/64"), None);
        assert_eq!(gateway_of("nonsense"), None);
    }

    #[test]
    fn bridge_names_are_short_and_differ_per_node() {
        let a = bridge_name("node-1");
        let b = bridge_name("node-2");
        assert_ne!(a, b);
        assert!(a.len() <= 15 && a.starts_with("skiff"), "{a}");
        assert_eq!(a, bridge_name("node-1"));
    }

    #[test]
    fn the_conflist_chains_bridge_host_local_and_portmap_on_the_pod_cidr() {
        let conflist = config().conflist();
        assert_eq!(conflist["name"], NETWORK_NAME);
        let bridge = &conflist["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["bridge"], bridge_name("node-1"));
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["hairpinMode"], true);
        assert_eq!(bridge["ipam"]["type"], "host-local");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.7.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/data/node-1/cni/ipam");
        let portmap = &conflist["plugins"][1];
        assert_eq!(portmap["type"], "portmap");
        assert_eq!(portmap["capabilities"]["portMappings"], true);
    }

    #[test]
    fn writing_the_conflist_leaves_one_file_that_parses() {
        let dir = tempfile::tempdir().unwrap();
        let config = CniConfig { ipam_data_dir: dir.path().join("ipam"), ..config() };
        let path = config.write(&dir.path().join("net.d")).unwrap();
        let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written, config.conflist());
        assert_eq!(std::fs::read_dir(dir.path().join("net.d")).unwrap().count(), 1);
        assert!(dir.path().join("ipam").is_dir());
    }
}
