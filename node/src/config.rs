//! What the agent needs: who it is, where the apiservers are, where its
//! data lives, and the kubelet's timings and reservations.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The Node's name.
    pub name: String,
    /// Apiservers' client addresses; any of them will do.
    pub servers: Vec<String>,
    /// TLS to the apiservers and the client certificate to present; `None`: plaintext.
    pub tls: Option<skiff_pki::ClientFiles>,
    /// A bearer token to send instead of a client certificate.
    pub token: Option<skiff_client::runtime::config::TokenSource>,
    /// A join token (`--token`): the node gets its own certificate with it
    /// and keeps it under `<data_dir>/pki`.
    pub join_token: Option<skiff_pki::token::JoinToken>,
    /// Everything the agent keeps: pods' volumes, logs, containerd's state.
    pub data_dir: PathBuf,
    /// The address other nodes and the apiservers reach this node at.
    pub node_ip: String,
    /// Where the agent serves logs, exec, `/metrics` and `/stats/summary`.
    pub listen: SocketAddr,
    /// Static pod manifests, read on change and at least every 20 s.
    pub manifest_dir: Option<PathBuf>,
    /// A URL serving static pod manifests, read every 20 s.
    pub manifest_url: Option<String>,
    /// How often the node's Lease is renewed.
    pub lease_renew_interval: Duration,
    /// How long the Lease says it is valid.
    pub lease_duration: Duration,
    /// NodeStatus is posted on change and at least this often.
    pub status_update_frequency: Duration,
    /// How often CPU usage is sampled for `/stats/summary`'s rates
    /// (`kubectl top`), as cAdvisor's housekeeping.
    pub housekeeping_interval: Duration,
    /// Sysctls pods may set beyond the safe ones: names, or prefixes
    /// ending in `*` (the kubelet's `--allowed-unsafe-sysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Labels added to the Node at registration (`--node-labels`).
    pub node_labels: BTreeMap<String, String>,
    /// Taints the Node registers with (`--register-with-taints`).
    pub register_with_taints: Vec<Taint>,
    /// Held back from the host's capacity for the system (`--system-reserved`):
    /// resource name → quantity.
    pub system_reserved: BTreeMap<String, String>,
    /// Pods this node takes at most.
    pub max_pods: u32,
    /// `spec.podCIDR` when no node IPAM controller assigns one.
    pub pod_cidr: Option<String>,
    /// Cluster DNS servers written into pods' resolv.conf (ClusterFirst).
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// The service proxy's settings; `None`: no service proxy on this node.
    pub proxy: Option<crate::proxy::ProxyConfig>,
    /// Serve cluster DNS at the pod bridge's gateway address and give pods
    /// that address, when `cluster_dns` names no server.
    pub serve_dns: bool,
}

impl NodeConfig {
    /// A node named `name` for `servers`, keeping its data in `data_dir`,
    /// with the kubelet's defaults.
    pub fn new(name: &str, servers: Vec<String>, data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            name: name.to_string(),
            servers,
            tls: None,
            token: None,
            join_token: None,
            data_dir,
            node_ip: "127.0.0.1".to_string(),
            listen: SocketAddr::from(([127, 0, 0, 1], 10250)),
            manifest_dir: None,
            manifest_url: None,
            lease_renew_interval: Duration::from_secs(10),
            lease_duration: Duration::from_secs(40),
            status_update_frequency: Duration::from_secs(10),
            housekeeping_interval: Duration::from_secs(10),
            allowed_unsafe_sysctls: Vec::new(),
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            system_reserved: BTreeMap::new(),
            max_pods: 110,
            pod_cidr: None,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".to_string(),
            proxy: None,
            serve_dns: false,
        }
    }

    /// Pods' log files: `<dir>/<namespace>_<name>_<uid>/<container>/<n>.log`.
    pub fn pod_log_dir(&self) -> PathBuf {
        self.data_dir.join("logs").join("pods")
    }

    /// Pods' volumes and state: `<dir>/<uid>/`.
    pub fn pods_dir(&self) -> PathBuf {
        self.data_dir.join("pods")
    }
}
