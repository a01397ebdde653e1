//! The service proxy, kube-proxy's iptables and nftables modes: every
//! Service's cluster IP and NodePort become NAT rules that send each new
//! connection to one of its ready endpoints. The kernel forwards; nothing
//! passes through this process.
//!
//! Data flow: the Service and EndpointSlice informers -> [`model`] (the
//! service ports and their endpoints for this node) -> [`rules`] (the
//! chains) -> one `iptables-restore --noflush` transaction holding only
//! the chains that changed. A sync runs when something changed, at most
//! once per `min_sync_period`; every `sync_period` the kernel is checked
//! for the node's jumps (someone may have flushed them), and synced in
//! full if they are gone. A full sync reads the tables back and writes
//! only what differs from them. A failed restore leaves the kernel as it
//! was (the transaction is atomic) and is retried in full.
//!
//! The rules outlive the agent: a killed agent's Services keep working,
//! and the next start finds its chains, rewrites those that differ and
//! removes the ones no longer wanted. [`cleanup`] removes Skiff's chains
//! and jumps.
//!
//! The nftables mode ([`nft`]) has the same flow with a table per node in
//! place of chains in the shared tables, one `nft -f` transaction per
//! sync; a full sync there rewrites the whole table (kube-proxy's way)
//! in a fraction of the iptables mode's time (at 1,000 Services x 10
//! endpoints, 0.3-0.5 s against 1.7-2.7 s, `bench/README.md`). Both modes
//! clear UDP conntrack entries the same way.

pub mod conntrack;
pub mod model;
pub mod nft;
pub mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use serde_json::json;
use skiff_client::runtime::events::Recorder;
use skiff_client::runtime::informer::Informers;
use skiff_client::Client;
use skiff_shutdown::Shutdown;
use tokio::io::AsyncWriteExt;

use self::rules::{Context, Rules};

/// Why an iptables command failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The command could not run.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command.
        command: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The command ran and failed.
    #[error("{command} failed: {message}")]
    Failed {
        /// The command and its arguments.
        command: String,
        /// Its error output.
        message: String,
    },
}

/// How the rules are programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// kube-proxy's iptables mode ([`rules`]).
    Iptables,
    /// kube-proxy's nftables mode ([`nft`]).
    Nftables,
}

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// iptables or nftables.
    pub mode: Mode,
    /// The node's name: which endpoints are local, and the tag of its chains.
    pub node_name: String,
    /// The whole pod range.
    pub cluster_cidr: String,
    /// The node's pod bridge: its pods' traffic arrives there. `None`: a
    /// host whose only clients are the host itself and outside traffic.
    pub bridge: Option<String>,
    /// Syncs at most this often (kube-proxy's `--iptables-min-sync-period`).
    pub min_sync_period: Duration,
    /// How often the kernel is checked for the rules (`--iptables-sync-period`).
    pub sync_period: Duration,
}

impl ProxyConfig {
    /// kube-proxy's defaults for `node_name`.
    pub fn new(node_name: &str, cluster_cidr: &str) -> ProxyConfig {
        ProxyConfig {
            mode: Mode::Iptables,
            node_name: node_name.to_string(),
            cluster_cidr: cluster_cidr.to_string(),
            bridge: None,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
        }
    }
}

/// The proxy's metrics, under kube-proxy's names.
struct ProxyMetrics {
    sync_duration: Histogram,
    last_sync: IntGauge,
    rules: IntGaugeVec,
    syncs: IntCounterVec,
}

fn metrics() -> &'static ProxyMetrics {
    static METRICS: OnceLock<ProxyMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let sync_duration = Histogram::with_opts(
            HistogramOpts::new("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds")
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets")),
        )
        .expect("valid metric");
        let last_sync = IntGauge::new(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
        )
        .expect("valid metric");
        let rules = IntGaugeVec::new(
            Opts::new("kubeproxy_sync_proxy_rules_iptables_total", "Number of proxy iptables rules programmed"),
            &["table"],
        )
        .expect("valid metric");
        let syncs = IntCounterVec::new(
            Opts::new("skiff_proxy_syncs_total", "Rule syncs by kind (full, partial, unchanged, failed)"),
            &["kind"],
        )
        .expect("valid metric");
        let registry = &crate::metrics::metrics().registry;
        for m in [
            Box::new(sync_duration.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(last_sync.clone()),
            Box::new(rules.clone()),
            Box::new(syncs.clone()),
        ] {
            registry.register(m).expect("metric registered once");
        }
        ProxyMetrics { sync_duration, last_sync, rules, syncs }
    })
}

/// Runs the proxy until `shutdown`. Events (a NodePort another process
/// holds) are recorded through `client`.
pub async fn run(informers: &Informers, client: Client, config: ProxyConfig, shutdown: Shutdown) {
    let services = informers.informer::<Service>();
    let slices = informers.informer::<EndpointSlice>();
    let (mut service_changes, mut slice_changes) = (services.subscribe(), slices.subscribe());
    let (service_store, slice_store) = (services.store(), slices.store());
    tokio::select! {
        _ = shutdown.cancelled() => return,
        ready = async { service_store.wait_until_ready().await.and(slice_store.wait_until_ready().await) } => {
            if ready.is_err() { return; }
        }
    }
    prepare_kernel(config.mode);
    let context = Context { tag: rules::tag(&config.node_name), cluster_cidr: config.cluster_cidr.clone() };
    // The rules of the other mode, from an earlier run, would take the
    // traffic first.
    let other_mode = match config.mode {
        Mode::Iptables => nft::cleanup(Some(&context.tag)).await,
        Mode::Nftables => cleanup_iptables(Some(&context.tag)).await,
    };
    match other_mode {
        Ok(0) => {}
        Ok(chains) => tracing::info!(chains, "removed this node's service rules of the other proxy mode"),
        Err(e) => tracing::warn!(error = %e, "removing this node's service rules of the other proxy mode"),
    }
    let recorder = Recorder::new("kube-proxy");
    let mut syncer = Syncer::new(config, context);
    let mut dirty = true;
    let mut check = tokio::time::interval(syncer.config.sync_period);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if dirty {
            let wait = syncer.config.min_sync_period.saturating_sub(syncer.since_last());
            if wait.is_zero() {
                // What is queued is in the stores already: one sync covers it.
                while let Some(Some(_)) = service_changes.recv().now_or_never() {}
                while let Some(Some(_)) = slice_changes.recv().now_or_never() {}
                let ports = model::service_ports(&service_store.list(), &slice_store.list(), &syncer.config.node_name);
                match syncer.sync(&ports).await {
                    Ok(synced) => {
                        dirty = false;
                        report_taken_node_ports(&client, &recorder, &service_store.list(), &synced.new_node_ports)
                            .await;
                    }
                    Err(e) => tracing::warn!(error = %e, "syncing the service rules failed; retrying in full"),
                }
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            n = service_changes.recv() => { if n.is_none() { return; } dirty = true; }
            n = slice_changes.recv() => { if n.is_none() { return; } dirty = true; }
            _ = check.tick() => {
                if !syncer.kernel_has_rules().await {
                    tracing::warn!("the service rules are missing from the kernel; rewriting them");
                    syncer.forget();
                    dirty = true;
                }
            }
        }
    }
}

/// The kernel settings the rules need: forwarding, and bridged traffic
/// through iptables (a pod answering a pod on its own bridge must pass
/// conntrack for the cluster IP to be put back). Best effort: a host
/// without `br_netfilter` still serves traffic between bridges.
fn prepare_kernel(mode: Mode) {
    let mut settings =
        vec![("/proc/sys/net/ipv4/ip_forward", "1"), ("/proc/sys/net/bridge/bridge-nf-call-iptables", "1")];
    if mode == Mode::Iptables {
        // NodePorts on 127.0.0.1: the kernel routes a packet from or to
        // 127.0.0.0/8 off the loopback device only with this (the rules'
        // SKIFF-FIREWALL drops what it would let in from elsewhere). The
        // nftables mode, like kube-proxy's, has no localhost NodePorts.
        settings.push(("/proc/sys/net/ipv4/conf/all/route_localnet", "1"));
    }
    for (path, value) in settings {
        if std::fs::read_to_string(path).is_ok_and(|v| v.trim() != value) {
            if let Err(e) = std::fs::write(path, value) {
                tracing::warn!(path, error = %e, "cannot set a kernel setting the service rules need");
            }
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// Chains (re)written.
    pub chains_written: usize,
    /// Chains removed.
    pub chains_deleted: usize,
    /// Jumps from the built-in chains added.
    pub jumps_added: usize,
    /// UDP flows cleared from conntrack (`conntrack -D` runs).
    pub flows_cleared: usize,
    /// NodePorts seen for the first time (to check for another listener).
    pub new_node_ports: Vec<(u16, &'static str)>,
}

/// What was written last, and how to write the next rule set.
pub struct Syncer {
    config: ProxyConfig,
    context: Context,
    /// The rules the kernel holds, as last written; `None`: unknown, the
    /// next sync writes everything and removes whatever else of ours it finds.
    written: Option<Rules>,
    /// The same for the nftables mode.
    nft_written: Option<nft::NftRules>,
    /// The service ports of the last sync, to find the UDP flows a change leaves wrong.
    synced: Option<Vec<model::ServicePort>>,
    /// Each service port's rules as last rendered: a sync renders only the
    /// ports that changed (at 10,000 endpoints, rendering them all is
    /// most of an incremental sync's own time).
    rendered: BTreeMap<model::ServicePort, rules::PortRules>,
    last_sync: Option<Instant>,
    /// NodePorts already checked for another listener.
    node_ports: BTreeSet<(u16, &'static str)>,
}

impl Syncer {
    /// A syncer that has written nothing yet.
    pub fn new(config: ProxyConfig, context: Context) -> Syncer {
        Syncer {
            config,
            context,
            written: None,
            nft_written: None,
            synced: None,
            rendered: BTreeMap::new(),
            last_sync: None,
            node_ports: BTreeSet::new(),
        }
    }

    fn since_last(&self) -> Duration {
        self.last_sync.map(|t| t.elapsed()).unwrap_or(Duration::MAX)
    }

    /// The next sync writes everything.
    pub fn forget(&mut self) {
        self.written = None;
        self.nft_written = None;
    }

    /// Brings the kernel to the rules for `ports`; the NodePorts seen for
    /// the first time.
    ///
    /// A full sync (the first, or after [`Syncer::forget`]) reads the
    /// kernel's rules back and writes only what differs from them, so a
    /// restarted agent whose rules are in place writes nothing; the rules
    /// are rendered as `iptables-save` prints them for that comparison to
    /// hold. Later syncs compare with what was written last.
    pub async fn sync(&mut self, ports: &[model::ServicePort]) -> Result<Synced, ProxyError> {
        let started = Instant::now();
        self.last_sync = Some(started);
        let full = match self.config.mode {
            Mode::Iptables => self.written.is_none(),
            Mode::Nftables => self.nft_written.is_none(),
        };
        let attempt = match self.config.mode {
            Mode::Iptables => self.sync_iptables(ports).await,
            Mode::Nftables => self.sync_nft(ports).await,
        };
        let (mut synced, changed) = match attempt {
            Ok(done) => done,
            Err(e) => {
                metrics().syncs.with_label_values(&["failed"]).inc();
                return Err(e);
            }
        };
        let elapsed = started.elapsed();
        metrics().sync_duration.observe(elapsed.as_secs_f64());
        metrics().last_sync.set(chrono::Utc::now().timestamp());
        let kind = match (full, changed) {
            (true, _) => "full",
            (false, true) => "partial",
            (false, false) => "unchanged",
        };
        metrics().syncs.with_label_values(&[kind]).inc();
        if full {
            tracing::info!(?elapsed, service_ports = ports.len(), changed, mode = ?self.config.mode, "service rules synced in full");
        } else if changed {
            tracing::debug!(?elapsed, service_ports = ports.len(), "service rules synced");
        }
        if let Some(old) = self.synced.replace(ports.to_vec()) {
            synced.flows_cleared = conntrack::clear(&conntrack::stale_flows(&old, ports)).await;
        }
        let seen: BTreeSet<(u16, &'static str)> =
            ports.iter().filter_map(|p| p.node_port.map(|n| (n, p.protocol))).collect();
        synced.new_node_ports = seen.difference(&self.node_ports).copied().collect();
        self.node_ports = seen;
        Ok(synced)
    }

    /// One `iptables-restore` transaction; whether anything was written.
    async fn sync_iptables(&mut self, ports: &[model::ServicePort]) -> Result<(Synced, bool), ProxyError> {
        let wanted = self.render(ports);
        let jumps = self.jumps();
        let (old, missing) = match self.written.take() {
            Some(written) => (written, Vec::new()),
            None => {
                let saved = rules::parse_save(&iptables_save().await?);
                let tag = &self.context.tag;
                let old = saved.ours_only(|name| rules::owned_by(name, tag) || is_shared(name));
                let missing: Vec<&rules::Jump> = jumps.iter().filter(|j| !saved.has(j)).collect();
                (old, missing)
            }
        };
        let input = rules::restore_input(&old, &wanted, &missing);
        let changed = input.is_some();
        let mut synced = Synced::default();
        if let Some(input) = input {
            for line in input.lines() {
                match line.as_bytes().first() {
                    Some(b':') => synced.chains_written += 1,
                    Some(b'-') if line.starts_with("-X ") => {
                        synced.chains_written -= 1;
                        synced.chains_deleted += 1;
                    }
                    Some(b'-') if line.starts_with("-I ") => synced.jumps_added += 1,
                    _ => {}
                }
            }
            restore(&input).await?;
        }
        for (table, chains) in [("nat", &wanted.nat), ("filter", &wanted.filter)] {
            metrics().rules.with_label_values(&[table]).set(chains.values().map(Vec::len).sum::<usize>() as i64);
        }
        self.written = Some(wanted);
        Ok((synced, changed))
    }

    /// One `nft -f` transaction; whether anything was written. A full
    /// sync rewrites the node's whole table (atomically: traffic never
    /// sees it half written) and deletes what it holds besides.
    async fn sync_nft(&mut self, ports: &[model::ServicePort]) -> Result<(Synced, bool), ProxyError> {
        let wanted = nft::render(ports, &self.context, self.config.bridge.as_deref());
        let table = nft::table(&self.context.tag);
        let old = self.nft_written.take();
        let listed = match old {
            Some(_) => nft::Listed::default(),
            None => nft::Kernel::list(&table).await?,
        };
        let script = nft::transaction(&table, old.as_ref(), &wanted, &listed);
        let changed = script.is_some();
        let mut synced = Synced::default();
        if let Some(script) = script {
            for line in script.lines() {
                // Each chain written is declared or flushed, once.
                if line.starts_with("flush chain ") || line.starts_with("add chain ") {
                    synced.chains_written += 1;
                } else if line.starts_with("delete chain ") {
                    synced.chains_written -= 1;
                    synced.chains_deleted += 1;
                }
            }
            nft::Kernel::apply(&script).await?;
        }
        metrics().rules.with_label_values(&["nftables"]).set(wanted.size() as i64);
        self.nft_written = Some(wanted);
        Ok((synced, changed))
    }

    /// The rules for `ports`, rendering only the ports not rendered last time.
    fn render(&mut self, ports: &[model::ServicePort]) -> Rules {
        let mut rendered = BTreeMap::new();
        for port in ports {
            let part = self.rendered.remove(port).unwrap_or_else(|| rules::render_port(port, &self.context));
            rendered.insert(port.clone(), part);
        }
        self.rendered = rendered;
        rules::assemble(ports.iter().map(|port| &self.rendered[port]), &self.context)
    }

    /// Whether the kernel still holds this node's jumps (and so its top
    /// chain, which they name). Lists only the built-in chains: cheap
    /// however many rules the node has.
    pub async fn kernel_has_rules(&self) -> bool {
        if self.config.mode == Mode::Nftables {
            return nft::Kernel::has_rules(&nft::table(&self.context.tag)).await;
        }
        let jumps = self.jumps();
        let chains: BTreeSet<(&str, &str)> = jumps.iter().map(|j| (j.table, j.chain)).collect();
        for (table, chain) in chains {
            let Ok(listed) = iptables(&["-w", "-t", table, "-S", chain]).await else { return false };
            let listed = rules::parse_save(&format!("*{table}\n{listed}COMMIT\n"));
            if !jumps.iter().filter(|j| j.table == table && j.chain == chain).all(|j| listed.has(j)) {
                return false;
            }
        }
        true
    }

    fn jumps(&self) -> Vec<rules::Jump> {
        rules::jumps(&self.context.tag, self.config.bridge.as_deref())
    }
}

fn is_shared(name: &str) -> bool {
    name == rules::MARK_MASQ || name == rules::POSTROUTING || name == rules::FIREWALL
}

/// Removes Skiff's rules in both modes: only those of the node tagged
/// `tag` (and the shared iptables chains if no other node's remain), or,
/// with `None`, every one (`skiff proxy --cleanup`). The number of chains removed.
pub async fn cleanup(tag: Option<&str>) -> Result<usize, ProxyError> {
    Ok(cleanup_iptables(tag).await? + nft::cleanup(tag).await?)
}

/// [`cleanup`]'s iptables half: Skiff's chains and the jumps to them.
async fn cleanup_iptables(tag: Option<&str>) -> Result<usize, ProxyError> {
    let saved = iptables_save().await?;
    let present = rules::parse_save(&saved).ours;
    let others_remain = tag.is_some_and(|tag| {
        present.nat.keys().chain(present.filter.keys()).any(|n| !is_shared(n) && !rules::owned_by(n, tag))
    });
    let removed = |name: &str| match tag {
        None => true,
        Some(tag) => rules::owned_by(name, tag) || (is_shared(name) && !others_remain),
    };
    let mut input = String::new();
    let mut count = 0;
    let mut table = "";
    let mut doomed: Vec<String> = Vec::new();
    let mut deletions: Vec<String> = Vec::new();
    let flush = |input: &mut String, doomed: &mut Vec<String>, deletions: &mut Vec<String>| {
        if doomed.is_empty() && deletions.is_empty() {
            return;
        }
        for name in doomed.iter() {
            input.push_str(&format!(":{name} - [0:0]\n"));
        }
        for rule in deletions.drain(..) {
            input.push_str(&format!("-D {rule}\n"));
        }
        for name in doomed.drain(..) {
            input.push_str(&format!("-X {name}\n"));
        }
        input.push_str("COMMIT\n");
    };
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = if matches!(name.trim(), "nat" | "filter") { name.trim() } else { "" };
            continue;
        }
        if table.is_empty() {
            continue;
        }
        if line == "COMMIT" {
            if !doomed.is_empty() || !deletions.is_empty() {
                input.push_str(&format!("*{table}\n"));
                count += doomed.len();
                flush(&mut input, &mut doomed, &mut deletions);
            }
            continue;
        }
        if let Some(declared) = line.strip_prefix(':') {
            let name = declared.split_whitespace().next().unwrap_or_default();
            if name.starts_with(rules::PREFIX) && removed(name) {
                doomed.push(name.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            // A jump to a doomed chain from a chain that stays.
            let chain = rule.split_whitespace().next().unwrap_or_default();
            let target = rule.split(" -j ").nth(1).and_then(|t| t.split_whitespace().next()).unwrap_or_default();
            let from_kept = !(chain.starts_with(rules::PREFIX) && removed(chain));
            if from_kept && target.starts_with(rules::PREFIX) && removed(target) {
                deletions.push(rule.to_string());
            }
        }
    }
    if !input.is_empty() {
        restore(&input).await?;
    }
    Ok(count)
}

/// Warns, on the Service, of a NodePort another process on this host
/// already listens on: the rules take that port's traffic from it.
async fn report_taken_node_ports(
    client: &Client,
    recorder: &Recorder,
    services: &[Arc<Service>],
    new: &[(u16, &'static str)],
) {
    for &(port, protocol) in new {
        let taken = match protocol {
            "udp" => std::net::UdpSocket::bind(("0.0.0.0", port))
                .err()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::AddrInUse),
            _ => std::net::TcpListener::bind(("0.0.0.0", port))
                .err()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::AddrInUse),
        };
        if !taken {
            continue;
        }
        let owner = services.iter().find(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .is_some_and(|ports| ports.iter().any(|p| p.node_port == Some(port.into())))
        });
        let Some(service) = owner else { continue };
        let regarding = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": service.metadata.namespace, "name": service.metadata.name, "uid": service.metadata.uid},
        });
        let message =
            format!("NodePort {port}/{protocol} is already in use on this host; the service takes its traffic");
        tracing::warn!(port, protocol, "{message}");
        recorder.record(client, &regarding, "Warning", "NodePortInUse", &message).await;
    }
}

async fn iptables_save() -> Result<String, ProxyError> {
    run_command("iptables-save", &[], None).await
}

async fn iptables(args: &[&str]) -> Result<String, ProxyError> {
    run_command("iptables", args, None).await
}

/// One `iptables-restore --noflush` transaction.
async fn restore(input: &str) -> Result<(), ProxyError> {
    run_command("iptables-restore", &["--noflush", "--wait"], Some(input)).await.map(|_| ())
}

async fn run_command(command: &'static str, args: &[&str], stdin: Option<&str>) -> Result<String, ProxyError> {
    let mut child = tokio::process::Command::new(command)
        .args(args)
        .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ProxyError::Spawn { command, source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await.map_err(|source| ProxyError::Spawn { command, source })?;
    }
    let output = child.wait_with_output().await.map_err(|source| ProxyError::Spawn { command, source })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(ProxyError::Failed {
        command: format!("{command} {}", args.join(" ")),
        message: String::from_utf8_lossy(&output.stderr).trim().replace('\n', "; "),
    })
}
