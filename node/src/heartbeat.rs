//! Registration and the node's two heartbeats, as the kubelet keeps them:
//! the Lease in `kube-node-lease` renewed every `lease_renew_interval`
//! (cheap, what the node lifecycle controller watches first), and the
//! NodeStatus posted on change and at least every
//! `status_update_frequency`.
//!
//! A failed write is retried after a short pause rather than at the next
//! interval, so an apiserver failover costs one retry, not a lease.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use serde_json::json;
use skiff_api::Reason;
use skiff_client::runtime::api::Api;
use skiff_client::{Client, ClientError};
use skiff_shutdown::Shutdown;
use tokio::sync::watch;

use crate::config::NodeConfig;
use crate::host::{self, HostInfo};
use crate::node_status::{self, Health};
use crate::runtime::{Runtime, RuntimeVersion};

/// The namespace of nodes' Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long to wait before retrying a failed heartbeat write.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// How often health (runtime, host figures) is checked for changes.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Creates the Node, or takes the existing one over (a restarted agent),
/// adding the labels asked for. Returns the Node as stored.
pub async fn register(client: &Client, config: &NodeConfig, info: &HostInfo) -> Result<Node, ClientError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let wanted = node_status::registration(config, info);
    match nodes.create(&wanted).await {
        Ok(node) => {
            tracing::info!(node = %config.name, "registered");
            Ok(node)
        }
        Err(e) if e.is(Reason::AlreadyExists) => {
            let labels = wanted.metadata.labels.unwrap_or_default();
            let node = nodes.patch(&config.name, &json!({"metadata": {"labels": labels}})).await?;
            tracing::info!(node = %config.name, "registered again (the Node existed)");
            Ok(node)
        }
        Err(e) => Err(e),
    }
}

/// Renews the node's Lease until `shutdown`.
pub async fn lease_loop(client: Client, config: Arc<NodeConfig>, node_uid: String, shutdown: Shutdown) {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let mut current: Option<Lease> = None;
    loop {
        let wait = match renew(&leases, &config, &node_uid, current.take()).await {
            Ok(lease) => {
                current = Some(lease);
                config.lease_renew_interval
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the node lease failed; retrying");
                RETRY_AFTER
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn renew(
    leases: &Api<Lease>,
    config: &NodeConfig,
    node_uid: &str,
    current: Option<Lease>,
) -> Result<Lease, ClientError> {
    let now = MicroTime(Utc::now());
    let lease = match current {
        Some(lease) => lease,
        None => match leases.get_opt(&config.name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(config.name.clone()),
                        namespace: Some(LEASE_NAMESPACE.to_string()),
                        // The Lease goes with its Node.
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: config.name.clone(),
                            uid: node_uid.to_string(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: Some(lease_spec(config, now.clone())),
                };
                return leases.create(&lease).await;
            }
        },
    };
    let mut renewed = lease;
    renewed.spec = Some(lease_spec(config, now));
    match leases.replace(&renewed).await {
        Err(e) if e.is(Reason::Conflict) || e.is(Reason::NotFound) => {
            // Someone else wrote it (or deleted it): read it afresh next time.
            Err(e)
        }
        other => other,
    }
}

fn lease_spec(config: &NodeConfig, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.name.clone()),
        lease_duration_seconds: Some(config.lease_duration.as_secs() as i32),
        renew_time: Some(now),
        ..Default::default()
    }
}

/// Posts the NodeStatus on change and at least every
/// `status_update_frequency` until `shutdown`. Sends each posted status
/// on `posted` (the agent reads the pod CIDR and its own state from it).
pub async fn status_loop(
    client: Client,
    config: Arc<NodeConfig>,
    runtime: Arc<dyn Runtime>,
    posted: watch::Sender<Option<Node>>,
    shutdown: Shutdown,
) {
    let nodes: Api<Node> = Api::all(client);
    let info = host::info();
    let mut version: Option<RuntimeVersion> = None;
    let mut last: Option<NodeStatus> = None;
    let mut last_posted = tokio::time::Instant::now();
    loop {
        let runtime_health = match runtime.version().await {
            Ok(v) => {
                version = Some(v);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        let health = Health { runtime: runtime_health, host: host::figures(&config.data_dir) };
        let reported = version.clone().unwrap_or(RuntimeVersion {
            runtime_name: "unknown".into(),
            runtime_version: "unknown".into(),
            runtime_api_version: "v1".into(),
        });
        let due = last_posted.elapsed() >= config.status_update_frequency;
        match node_status::status(&config, &info, &reported, &health, last.as_ref(), Utc::now()) {
            Ok(status) => {
                let changed = last.as_ref().is_none_or(|l| node_status::changed(l, &status));
                if changed || due {
                    let patch = json!({ "status": status });
                    match nodes.patch_status(&config.name, &patch).await {
                        Ok(node) => {
                            last = Some(status);
                            last_posted = tokio::time::Instant::now();
                            posted.send_replace(Some(node));
                        }
                        Err(e) => tracing::warn!(error = %e, "posting the node status failed; retrying"),
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot compute the node status"),
        }
        let wait = if last.is_none() { RETRY_AFTER } else { CHECK_EVERY };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
