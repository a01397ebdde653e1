//! `skiff node`'s flags, the kubelet's names where the kubelet has them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use k8s_openapi::api::core::v1::Taint;
use skiff_node::config::NodeConfig;
use skiff_node::process::ProcessOptions;

use crate::parse_duration;

/// `skiff node`.
#[derive(Args, Clone, Debug)]
pub struct NodeArgs {
    /// Apiservers' client addresses, comma-separated (any of them will do).
    #[arg(long, value_delimiter = ',', required = true)]
    pub server: Vec<String>,
    #[command(flatten)]
    pub tls: skiff_client::runtime::config::ClientTlsArgs,
    /// Join with this token (`skiffctl token create`: K10<CA hash>::<id>.<secret>):
    /// the node checks the cluster's CA against the hash, then trades the
    /// token for a certificate of its own, kept under <data-dir>/pki.
    #[arg(long, conflicts_with_all = ["client_certificate", "token_file"], value_parser = parse_token)]
    pub token: Option<skiff_pki::token::JoinToken>,
    /// The Node's name (default: this host's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Where the agent keeps pods' volumes and logs, and its containerd's state.
    #[arg(long, default_value = "/var/lib/skiff/node")]
    pub data_dir: PathBuf,
    /// The address other nodes and the apiservers reach this node at.
    #[arg(long, default_value = "127.0.0.1")]
    pub node_ip: String,
    /// Where the agent serves logs, exec, /metrics and /stats/summary.
    #[arg(long, default_value = "127.0.0.1:10250")]
    pub listen: SocketAddr,
    /// Static pod manifests, read on change and at least every 20 s.
    #[arg(long)]
    pub manifest_dir: Option<PathBuf>,
    /// A URL serving static pod manifests, read every 20 s.
    #[arg(long)]
    pub manifest_url: Option<String>,
    /// The node's pod CIDR when no node IPAM controller assigns one.
    #[arg(long)]
    pub pod_cidr: Option<String>,
    /// Labels to register the node with, `key=value,...`.
    #[arg(long, value_delimiter = ',')]
    pub node_labels: Vec<String>,
    /// Taints to register the node with, `key[=value]:Effect,...`.
    #[arg(long, value_delimiter = ',')]
    pub register_with_taints: Vec<String>,
    /// Resources held back for the system, `cpu=500m,memory=1Gi,...`.
    #[arg(long, value_delimiter = ',')]
    pub system_reserved: Vec<String>,
    /// Pods this node takes at most.
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// How often the node's Lease is renewed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub node_lease_renew_interval: Duration,
    /// NodeStatus is posted on change and at least this often.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub node_status_update_frequency: Duration,
    /// How often CPU usage is sampled for the rates `kubectl top` shows.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub housekeeping_interval: Duration,
    /// Sysctls pods may set beyond the safe ones, comma-separated: names,
    /// or prefixes ending in `*` (`net.core.*`). Only namespaced ones can
    /// be allowed.
    #[arg(long, value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// DNS servers for pods with dnsPolicy ClusterFirst, comma-separated
    /// [default: the node's own, at its pod bridge's gateway address]
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<String>,
    /// Serve no cluster DNS: pods without --cluster-dns get the host's resolvers.
    #[arg(long)]
    pub disable_dns: bool,
    #[command(flatten)]
    pub proxy: ProxyFlags,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Use this CRI endpoint (e.g. unix:///run/containerd/containerd.sock)
    /// instead of starting a private containerd.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// The containerd binary for the private containerd.
    #[arg(long, default_value = "containerd")]
    pub containerd: PathBuf,
    /// Image archives (OCI or docker) imported at start and when added
    /// [default: <data-dir>/images].
    #[arg(long)]
    pub images_dir: Option<PathBuf>,
    /// Where the CNI conflist goes with --container-runtime-endpoint.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Stop and remove this node's containers when the agent exits (by
    /// default they keep running for the next start to adopt).
    #[arg(long)]
    pub remove_pods_on_exit: bool,
}

/// A join token from the command line (`--token`).
/// The service proxy's flags, kube-proxy's names, shared by `skiff node`
/// and `skiff proxy`.
#[derive(Args, Clone, Debug)]
pub struct ProxyFlags {
    /// How Services are proxied: `iptables` (kube-proxy's iptables mode),
    /// `nftables` (its nftables mode: one table per node, syncs that cost
    /// what changed; needs the `nft` command) or `none` (another proxy
    /// runs on this host).
    #[arg(long, default_value = "iptables", value_parser = ["iptables", "nftables", "none"])]
    pub proxy_mode: String,
    /// The whole pod range: traffic to a cluster IP from outside it is masqueraded.
    #[arg(long, default_value = skiff_node::cni::CLUSTER_CIDR)]
    pub cluster_cidr: String,
    /// Rules are synced at most this often, however often Services and
    /// endpoints change.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub iptables_min_sync_period: Duration,
    /// How often the kernel is checked for the rules (and they are rewritten if gone).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub iptables_sync_period: Duration,
}

impl ProxyFlags {
    /// The proxy's config for the node `name`; `None` with `--proxy-mode none`.
    pub fn into_config(
        self,
        name: &str,
        bridge: Option<String>,
    ) -> Result<Option<skiff_node::proxy::ProxyConfig>, String> {
        if self.proxy_mode == "none" {
            return Ok(None);
        }
        let cidr = &self.cluster_cidr;
        let valid = cidr.split_once('/').is_some_and(|(ip, bits)| {
            ip.parse::<std::net::Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
        });
        if !valid {
            return Err(format!("--cluster-cidr {cidr:?}: expected an IPv4 CIDR such as 10.244.0.0/16"));
        }
        if self.iptables_sync_period.is_zero() {
            return Err("--iptables-sync-period must be positive".into());
        }
        let mut config = skiff_node::proxy::ProxyConfig::new(name, cidr);
        if self.proxy_mode == "nftables" {
            config.mode = skiff_node::proxy::Mode::Nftables;
        }
        config.bridge = bridge;
        config.min_sync_period = self.iptables_min_sync_period;
        config.sync_period = self.iptables_sync_period;
        Ok(Some(config))
    }
}

/// `skiff proxy`: the service proxy alone, for a host that runs no node
/// agent, or `--cleanup` to remove every rule Skiff's proxies made.
#[derive(Args, Clone, Debug)]
pub struct ProxyArgs {
    /// Apiservers' client addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "cleanup")]
    pub server: Vec<String>,
    #[command(flatten)]
    pub tls: skiff_client::runtime::config::ClientTlsArgs,
    /// The node whose endpoints count as local [default: the hostname].
    #[arg(long)]
    pub hostname_override: Option<String>,
    #[command(flatten)]
    pub proxy: ProxyFlags,
    /// Remove every Skiff chain and the jumps to them from iptables, and
    /// every Skiff table from nftables, and exit.
    #[arg(long)]
    pub cleanup: bool,
}

impl ProxyArgs {
    /// Runs the proxy, or the cleanup, until `shutdown`.
    pub async fn run(self, shutdown: skiff_shutdown::Shutdown) -> Result<(), String> {
        if self.cleanup {
            let removed = skiff_node::proxy::cleanup(None).await.map_err(|e| e.to_string())?;
            eprintln!("removed {removed} Skiff chains");
            return Ok(());
        }
        let name = self.hostname_override.clone().unwrap_or_else(hostname);
        let Some(config) = self.proxy.into_config(&name, None)? else {
            return Err("--proxy-mode none: nothing to run".into());
        };
        let mut client_config = skiff_client::ClientConfig::new(&self.server);
        client_config.tls = self.tls.files();
        client_config.token = self.tls.token();
        let client = skiff_client::Client::from_config(&client_config).map_err(|e| e.to_string())?;
        let informers = skiff_client::runtime::informer::Informers::new(client.clone(), shutdown.clone());
        skiff_node::proxy::run(&informers, client, config, shutdown.clone()).await;
        shutdown.stop().await;
        Ok(())
    }
}

pub fn parse_token(s: &str) -> Result<skiff_pki::token::JoinToken, String> {
    skiff_pki::token::JoinToken::parse(s).map_err(|e| e.to_string())
}

/// `key=value` pairs; `what` names the flag in errors.
fn pairs(items: &[String], what: &str) -> Result<BTreeMap<String, String>, String> {
    items
        .iter()
        .filter(|i| !i.is_empty())
        .map(|i| {
            i.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("--{what} {i:?}: expected key=value"))
        })
        .collect()
}

/// Parses `key[=value]:Effect`.
pub fn parse_taint(s: &str) -> Result<Taint, String> {
    let (kv, effect) = s.rsplit_once(':').ok_or_else(|| format!("taint {s:?}: expected key[=value]:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!("taint {s:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("taint {s:?}: empty key"));
    }
    Ok(Taint { key: key.to_string(), value, effect: effect.to_string(), time_added: None })
}

/// This host's name, for the default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl NodeArgs {
    /// The process options, or why the flags are refused.
    pub fn into_options(self) -> Result<ProcessOptions, String> {
        let name = self.name.unwrap_or_else(hostname);
        let mut node = NodeConfig::new(&name, self.server, self.data_dir);
        node.tls = self.tls.files();
        node.token = self.tls.token();
        if let Some(token) = &self.token {
            if token.ca_hash.is_none() {
                return Err("--token: a token without its CA hash (K10<hash>::<id>.<secret>) pins no CA; use the whole token skiffctl token create printed".into());
            }
            // The token's pin, not --certificate-authority, says which CA to trust.
            node.tls = None;
        }
        node.join_token = self.token;
        node.node_ip = self.node_ip;
        node.listen = self.listen;
        node.manifest_dir = self.manifest_dir;
        node.manifest_url = self.manifest_url;
        node.pod_cidr = self.pod_cidr;
        node.node_labels = pairs(&self.node_labels, "node-labels")?;
        node.register_with_taints =
            self.register_with_taints.iter().map(|t| parse_taint(t)).collect::<Result<_, _>>()?;
        node.system_reserved = pairs(&self.system_reserved, "system-reserved")?;
        node.max_pods = self.max_pods;
        node.lease_renew_interval = self.node_lease_renew_interval;
        node.status_update_frequency = self.node_status_update_frequency;
        node.housekeeping_interval = self.housekeeping_interval;
        node.allowed_unsafe_sysctls = self.allowed_unsafe_sysctls;
        node.cluster_dns = self.cluster_dns;
        node.cluster_domain = self.cluster_domain;
        node.serve_dns = !self.disable_dns;
        node.proxy = self.proxy.into_config(&name, Some(skiff_node::cni::bridge_name(&name)))?;
        if node.lease_renew_interval.is_zero()
            || node.status_update_frequency.is_zero()
            || node.housekeeping_interval.is_zero()
        {
            return Err("--node-lease-renew-interval, --node-status-update-frequency and --housekeeping-interval must be positive".into());
        }
        let mut options = ProcessOptions::new(node);
        options.runtime_endpoint = self.container_runtime_endpoint;
        options.containerd_binary = self.containerd;
        options.images_dir = self.images_dir;
        options.cni_conf_dir = self.cni_conf_dir;
        options.remove_pods_on_exit = self.remove_pods_on_exit;
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_with_and_without_values() {
        let t = parse_taint("dedicated=gpu:NoSchedule").expect("valid");
        assert_eq!((t.key.as_str(), t.value.as_deref(), t.effect.as_str()), ("dedicated", Some("gpu"), "NoSchedule"));
        assert_eq!(parse_taint("spot:NoExecute").expect("valid").value, None);
        assert!(parse_taint("spot").is_err());
        assert!(parse_taint("spot:Sometimes").is_err());
        assert!(parse_taint("=x:NoSchedule").is_err());
    }

    #[test]
    fn key_value_flags_refuse_entries_without_a_key() {
        assert_eq!(pairs(&["a=1".into(), "b=".into()], "x").expect("valid")["b"], "");
        assert!(pairs(&["nokey".into()], "node-labels").expect_err("refused").contains("--node-labels"));
    }
}
