//! `skiff up`'s live status line: who leads, the revision, how many masters
//! answer, how many nodes are ready and how many times `skiff up` has
//! restarted a process, sampled every two seconds; and the lines about
//! exits and restarts printed among the status lines.
//!
//! Leader and revision come from each master's etcd Maintenance `Status`
//! (the revision is the leader's own), the leader's name from `MemberList`,
//! the nodes from a list of `Node` objects through the resource API.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;
use skiff_api::resources::{of, Kind};
use skiff_client::resources::ListParams;
use skiff_client::Client;
use skiff_proto::etcdserverpb::cluster_client::ClusterClient;
use skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use skiff_proto::etcdserverpb::{MemberListRequest, StatusRequest};
use tonic::transport::{Channel, Endpoint};

use super::MasterAddrs;

/// How long one sample may wait for a master before counting it as down.
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// One sample of the cluster, as the status line shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The leader's id and published name (empty until it has published it).
    pub leader: Option<(u64, String)>,
    /// The leader's applied revision, or the highest one seen without a leader.
    pub revision: i64,
    pub masters_answering: usize,
    pub masters: usize,
    /// Nodes whose Ready condition is True, and all nodes; `None` when no
    /// master could list them.
    pub nodes: Option<(usize, usize)>,
    /// Processes `skiff up` has started again after they exited; shown
    /// once there is one.
    pub restarts: u32,
    /// The controller manager holding the leader Lease, once one does.
    pub controller_manager: Option<String>,
    /// The scheduler holding the leader Lease, once one does.
    pub scheduler: Option<String>,
}

impl fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.leader {
            Some((_, name)) if !name.is_empty() => write!(f, "leader {name}")?,
            Some((id, _)) => write!(f, "leader id {id}")?,
            None => write!(f, "no leader")?,
        }
        write!(f, " · revision {} · masters up {}/{}", self.revision, self.masters_answering, self.masters)?;
        match self.nodes {
            Some((ready, all)) => write!(f, " · nodes ready {ready}/{all}")?,
            None => write!(f, " · nodes ready ?")?,
        }
        if self.restarts > 0 {
            write!(f, " · restarts {}", self.restarts)?;
        }
        if let Some(active) = &self.controller_manager {
            write!(f, " · controller-manager {active}")?;
        }
        if let Some(active) = &self.scheduler {
            write!(f, " · scheduler {active}")?;
        }
        Ok(())
    }
}

/// Whether a Node object's `Ready` condition is `True`.
pub fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Samples a cluster through its masters' client addresses.
pub struct Sampler {
    masters: Vec<Channel>,
    client: Client,
}

impl Sampler {
    /// Connections are made lazily, so a master that is still starting is
    /// simply not answering yet.
    /// It signs in as the cluster's admin (`pki/admin.crt`): the etcd API's
    /// status is for `system:masters` only.
    pub fn new(masters: &[MasterAddrs], pki: &std::path::Path) -> Result<Sampler, String> {
        let files = skiff_pki::ClientFiles {
            ca: pki.join("ca.crt"),
            cert: Some((pki.join("admin.crt"), pki.join("admin.key"))),
        };
        let tls = skiff_pki::transport::client_config(&files).map_err(|e| e.to_string())?;
        let connector = skiff_pki::Connector::new(std::sync::Arc::new(tls));
        let mut channels = Vec::new();
        for m in masters {
            let endpoint = Endpoint::from_shared(format!("https://{}", m.client))
                .map_err(|e| format!("bad address {}: {e}", m.client))?
                .connect_timeout(CALL_TIMEOUT)
                .timeout(CALL_TIMEOUT);
            channels.push(endpoint.connect_with_connector_lazy(connector.clone()));
        }
        let endpoints: Vec<&str> = masters.iter().map(|m| m.client.as_str()).collect();
        let client = Client::connect(&endpoints, None, Some(connector)).map_err(|e| e.to_string())?;
        Ok(Sampler { masters: channels, client })
    }

    pub async fn sample(&self) -> ClusterStatus {
        let statuses = join_all(self.masters.iter().map(|ch| async move {
            let mut c = MaintenanceClient::new(ch.clone());
            tokio::time::timeout(CALL_TIMEOUT, c.status(StatusRequest {})).await.ok()?.ok().map(|r| r.into_inner())
        }))
        .await;
        let answering: Vec<_> = statuses.iter().enumerate().filter_map(|(i, s)| Some((i, s.as_ref()?))).collect();
        let revision_of = |s: &skiff_proto::etcdserverpb::StatusResponse| s.header.as_ref().map_or(0, |h| h.revision);
        let leader_id = answering.iter().map(|(_, s)| s.leader).find(|&l| l != 0);
        let revision = leader_id
            .and_then(|l| answering.iter().find(|(_, s)| s.header.as_ref().is_some_and(|h| h.member_id == l)))
            .map(|(_, s)| revision_of(s))
            .unwrap_or_else(|| answering.iter().map(|(_, s)| revision_of(s)).max().unwrap_or(0));
        let leader = match (leader_id, answering.first()) {
            (Some(id), Some((i, _))) => Some((id, self.member_name(*i, id).await)),
            (Some(id), None) => Some((id, String::new())),
            (None, _) => None,
        };
        ClusterStatus {
            leader,
            revision,
            masters_answering: answering.len(),
            masters: self.masters.len(),
            nodes: self.nodes().await,
            restarts: 0,
            controller_manager: self.lease_holder("kube-system", "kube-controller-manager").await,
            scheduler: self.lease_holder("kube-system", "kube-scheduler").await,
        }
    }

    /// Who holds a leader-election Lease (none when it is free or unknown).
    async fn lease_holder(&self, namespace: &str, name: &str) -> Option<String> {
        let get = self.client.get(of(Kind::Lease), namespace, name);
        let lease = tokio::time::timeout(CALL_TIMEOUT, get).await.ok()?.ok()?;
        lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_string)
    }

    /// Member `id`'s name, asked of master `via` (empty when unknown).
    async fn member_name(&self, via: usize, id: u64) -> String {
        let mut c = ClusterClient::new(self.masters[via].clone());
        let list = tokio::time::timeout(CALL_TIMEOUT, c.member_list(MemberListRequest { linearizable: false })).await;
        match list {
            Ok(Ok(r)) => r.into_inner().members.into_iter().find(|m| m.id == id).map(|m| m.name).unwrap_or_default(),
            _ => String::new(),
        }
    }

    async fn nodes(&self) -> Option<(usize, usize)> {
        let params = ListParams::default();
        let list = self.client.list(of(Kind::Node), "", &params);
        let nodes = tokio::time::timeout(2 * CALL_TIMEOUT, list).await.ok()?.ok()?;
        Some((nodes.items.iter().filter(|n| node_ready(n)).count(), nodes.items.len()))
    }
}

/// Writes status lines to stdout: on a terminal one line rewritten in place,
/// elsewhere (a log file, a pipe) a new line only when the status changed.
pub struct StatusPrinter {
    terminal: bool,
    last: Option<String>,
}

impl Default for StatusPrinter {
    fn default() -> Self {
        StatusPrinter { terminal: std::io::stdout().is_terminal(), last: None }
    }
}

impl StatusPrinter {
    pub fn show(&mut self, line: String) {
        let mut out = std::io::stdout().lock();
        // Writes to a closed stdout are not worth stopping the cluster for.
        if self.terminal {
            let _ = write!(out, "\r\x1b[K{line}");
        } else if self.last.as_ref() != Some(&line) {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        self.last = Some(line);
    }

    /// Ends the rewritten line so that what follows starts on its own.
    pub fn finish(&mut self) {
        if self.terminal && self.last.take().is_some() {
            println!();
        }
    }

    /// Prints `message` on a line of its own; on a terminal the status
    /// line stays below it.
    pub fn note(&mut self, message: &str) {
        let mut out = std::io::stdout().lock();
        if self.terminal {
            let _ = write!(out, "\r\x1b[K{message}\n{}", self.last.as_deref().unwrap_or_default());
        } else {
            let _ = writeln!(out, "{message}");
        }
        let _ = out.flush();
    }
}

/// Locks the printer that the status loop and `skiff up`'s notes share
/// (never held across an await); a panic while printing left nothing
/// half-done worth refusing for.
pub fn lock(printer: &Mutex<StatusPrinter>) -> MutexGuard<'_, StatusPrinter> {
    printer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Samples `sampler` every `every` and shows the result, with the count of
/// `restarts`, forever.
pub async fn show_every(sampler: &Sampler, printer: &Mutex<StatusPrinter>, restarts: &AtomicU32, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let status = ClusterStatus { restarts: restarts.load(Ordering::Relaxed), ..sampler.sample().await };
        lock(printer).show(status.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_is_ready_only_with_a_true_ready_condition() {
        let node = |conditions: Value| json!({"metadata": {"name": "n"}, "status": {"conditions": conditions}});
        assert!(node_ready(&node(
            json!([{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}])
        )));
        assert!(!node_ready(&node(json!([{"type": "Ready", "status": "False"}]))));
        assert!(!node_ready(&node(json!([{"type": "Ready", "status": "Unknown"}]))));
        assert!(!node_ready(&node(json!([{"type": "NetworkUnavailable", "status": "True"}]))));
        assert!(!node_ready(&json!({"metadata": {"name": "n"}})));
    }

    #[test]
    fn the_line_names_the_leader_and_counts() {
        let mut s = ClusterStatus {
            leader: Some((2, "master-2".into())),
            revision: 1234,
            masters_answering: 3,
            masters: 3,
            nodes: Some((0, 0)),
            restarts: 0,
            controller_manager: None,
            scheduler: None,
        };
        assert_eq!(s.to_string(), "leader master-2 · revision 1234 · masters up 3/3 · nodes ready 0/0");
        s.leader = Some((2, String::new()));
        s.nodes = None;
        assert_eq!(s.to_string(), "leader id 2 · revision 1234 · masters up 3/3 · nodes ready ?");
        s.leader = None;
        s.masters_answering = 1;
        assert_eq!(s.to_string(), "no leader · revision 1234 · masters up 1/3 · nodes ready ?");
        s.restarts = 2;
        assert_eq!(s.to_string(), "no leader · revision 1234 · masters up 1/3 · nodes ready ? · restarts 2");
        s.controller_manager = Some("master-3".into());
        assert_eq!(
            s.to_string(),
            "no leader · revision 1234 · masters up 1/3 · nodes ready ? · restarts 2 · controller-manager master-3"
        );
        s.scheduler = Some("master-1".into());
        assert!(s.to_string().ends_with(" · controller-manager master-3 · scheduler master-1"));
    }
}
