//! How a member enters its cluster: the lowest founding member initializes
//! Raft, a fresh member asks a running cluster to add it, a member with
//! state on disk simply rejoins. Once in, it publishes its name and URLs
//! through the log.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};

use super::admin::{AdminRequest, AdminResponse};
use super::identity::{cluster_id_of, save_identity};
use super::{StartError, Store};
use crate::error::WireError;
use crate::network::PeerMethod;
use crate::types::{Command, MemberInfo, Node, NodeId};

impl Store {
    /// Brings a fresh member into its cluster: the lowest founding id
    /// initializes, a joining member asks the cluster to add it. A member
    /// with Raft state on disk does nothing here: it simply rejoins.
    pub async fn bootstrap(&self) -> Result<(), StartError> {
        if self.inner.log.has_state() {
            self.spawn_publisher();
            return Ok(());
        }
        let config = &self.inner.config;
        if let Some(join) = config.join.clone() {
            self.join(&join).await?;
        } else if !config.initial_cluster.is_empty() {
            self.bootstrap_initial().await?;
        } else {
            return Err(StartError::Config("a fresh data dir needs --initial-cluster or --join".into()));
        }
        self.spawn_publisher();
        Ok(())
    }

    async fn bootstrap_initial(&self) -> Result<(), StartError> {
        let config = &self.inner.config;
        if !config.initial_cluster.contains_key(&config.id) {
            return Err(StartError::Config(format!("--initial-cluster does not name this member's id {}", config.id)));
        }
        // Ask the other founders whether a cluster already exists: a wiped
        // member must not initialize again or rejoin under its old id.
        let mut existing = false;
        for (&id, addr) in &config.initial_cluster {
            if id == config.id {
                continue;
            }
            let probe: Result<Result<AdminResponse, WireError>, _> = self
                .inner
                .peers
                .call(addr, id, PeerMethod::Admin, &AdminRequest::Probe, Duration::from_millis(800))
                .await;
            if let Ok(Ok(AdminResponse::Probe { initialized: true, members, .. })) = probe {
                existing = true;
                if let Some(me) = members.iter().find(|m| m.id == config.id) {
                    if me.incarnation != self.incarnation() {
                        return Err(StartError::Refused(format!(
                            "member {} ({}) already belongs to the running cluster and this data dir is new: \
                             its data was lost. Remove it (skiffctl member remove {}) and add it back with a new id",
                            config.id, me.name, config.id
                        )));
                    }
                }
            }
        }
        // A data dir created by an earlier, failed start may lack the id.
        let mut identity = self.inner.identity.lock().expect("poisoned").clone();
        if identity.cluster_id == 0 {
            identity.cluster_id = cluster_id_of(&config.initial_cluster);
            save_identity(&config.data_dir, &identity)
                .map_err(|source| StartError::DataDirIo { path: config.data_dir.clone(), source })?;
            *self.inner.identity.lock().expect("poisoned") = identity;
        }
        let lowest = *config.initial_cluster.keys().next().expect("checked non-empty");
        if existing || lowest != config.id {
            // The founder that initializes replicates the membership to us.
            return Ok(());
        }
        let members: BTreeMap<NodeId, Node> =
            config.initial_cluster.iter().map(|(id, addr)| (*id, Node { addr: addr.clone() })).collect();
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(StartError::Initialize(e)),
        }
    }

    async fn join(&self, client_addr: &str) -> Result<(), StartError> {
        let config = &self.inner.config;
        let info = self.member_info();
        let cluster_id = crate::join::request_join(client_addr, &info, config.join_timeout, config.join_tls.as_ref())
            .await
            .map_err(StartError::Join)?;
        let mut identity = self.inner.identity.lock().expect("poisoned").clone();
        identity.cluster_id = cluster_id;
        save_identity(&config.data_dir, &identity)
            .map_err(|source| StartError::DataDirIo { path: config.data_dir.clone(), source })?;
        *self.inner.identity.lock().expect("poisoned") = identity;
        Ok(())
    }

    fn member_info(&self) -> MemberInfo {
        let config = &self.inner.config;
        MemberInfo {
            id: config.id,
            name: config.name.clone(),
            peer_urls: vec![format!("http://{}", config.peer_addr)],
            client_urls: config.client_urls.clone(),
            incarnation: self.incarnation(),
        }
    }

    /// Publishes this member's name and URLs through the log once it is
    /// part of the cluster, and again whenever they change.
    fn spawn_publisher(&self) {
        let store = self.clone();
        self.spawn(async move {
            let info = store.member_info();
            let mut delay = Duration::from_millis(200);
            loop {
                let published = store.inner.sm.members().into_iter().any(|m| m == info);
                if published {
                    return;
                }
                let in_cluster = store.inner.sm.membership().membership().get_node(&info.id).is_some();
                if in_cluster {
                    match store.write(Command::PublishMember(info.clone())).await {
                        Ok(_) => return,
                        Err(e) => tracing::debug!(error = %e, "publishing member info; will retry"),
                    }
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        });
    }
}
