//! Membership administration on the leader: joins, etcd's MemberAdd,
//! Promote, Remove and Update, and the lease-clock requests only the leader
//! can answer. A follower forwards each request to the leader; openraft
//! allows one membership change at a time, so they are serialized.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};

use super::Store;
use crate::error::{StoreError, WireError};
use crate::network::PeerMethod;
use crate::types::{MemberInfo, Node, NodeId, Raft};

/// Requests between members that only the leader may carry out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminRequest {
    /// A fresh member asks to be added (learner, catch up, promote).
    Join {
        info: MemberInfo,
        timeout_ms: u64,
    },
    /// etcd's MemberAdd: register a member that will start later.
    Add {
        peer_addr: String,
        learner: bool,
    },
    Promote {
        id: NodeId,
    },
    Remove {
        id: NodeId,
    },
    /// etcd's MemberUpdate: the member is now reached at `peer_addr`.
    Update {
        id: NodeId,
        peer_addr: String,
    },
    /// Whether this member has cluster state, and what it knows of members.
    Probe,
    /// Restart a lease's clock on the leader.
    LeaseKeepAlive {
        id: i64,
    },
    /// A lease's granted TTL and remaining seconds, from the leader's clock.
    LeaseTimeToLive {
        id: i64,
    },
    /// The leader hands leadership to the member it sends this to: start
    /// an election now (see `transfer`).
    Campaign,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminResponse {
    Joined {
        cluster_id: u64,
    },
    Added {
        id: NodeId,
    },
    Done,
    Probe {
        initialized: bool,
        cluster_id: u64,
        members: Vec<MemberInfo>,
        voters: Vec<NodeId>,
    },
    /// `ttl_seconds` granted and `remaining_seconds` on the leader's clock.
    Lease {
        ttl_seconds: i64,
        remaining_seconds: i64,
    },
}

/// One member as the Cluster API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub id: NodeId,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl Store {
    /// Members as the Cluster API lists them: every voter and learner, with
    /// the name and client URLs it published.
    pub fn members(&self) -> Vec<MemberView> {
        let membership = self.inner.raft.metrics().borrow().membership_config.clone();
        let published: BTreeMap<NodeId, MemberInfo> = self.inner.sm.members().into_iter().map(|m| (m.id, m)).collect();
        let voters: BTreeSet<NodeId> = membership.membership().voter_ids().collect();
        membership
            .membership()
            .nodes()
            .map(|(id, node)| {
                let info = published.get(id);
                MemberView {
                    id: *id,
                    name: info.map(|i| i.name.clone()).unwrap_or_default(),
                    peer_urls: vec![format!("http://{}", node.addr)],
                    client_urls: info.map(|i| i.client_urls.clone()).unwrap_or_default(),
                    is_learner: !voters.contains(id),
                }
            })
            .collect()
    }

    /// Runs an admin request on the leader, forwarding it if need be.
    pub async fn admin(&self, req: AdminRequest) -> Result<AdminResponse, StoreError> {
        let timeout = match &req {
            AdminRequest::Join { timeout_ms, .. } => Duration::from_millis(*timeout_ms + 2_000),
            _ => self.inner.config.request_timeout,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let result = match self.leader() {
                Some(l) if l == self.id() => self.admin_on_leader(req.clone()).await,
                Some(l) => match self.leader_addr(l) {
                    Some(addr) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let answer: Result<Result<AdminResponse, WireError>, _> =
                            self.inner.peers.call(&addr, l, PeerMethod::Admin, &req, left).await;
                        match answer {
                            Ok(r) => r.map_err(StoreError::from),
                            Err(e) => Err(StoreError::Peer(e)),
                        }
                    }
                    None => Err(StoreError::NoLeader),
                },
                None => Err(StoreError::NoLeader),
            };
            match result {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) if e.is_retryable() => return Err(StoreError::Timeout),
                other => return other,
            }
        }
    }

    /// Carries out an admin request here; fails with `NotLeader` elsewhere.
    pub async fn admin_on_leader(&self, req: AdminRequest) -> Result<AdminResponse, StoreError> {
        if let AdminRequest::LeaseKeepAlive { id } | AdminRequest::LeaseTimeToLive { id } = req {
            return self.lease_clock(id, matches!(req, AdminRequest::LeaseKeepAlive { .. }));
        }
        if let AdminRequest::Campaign = req {
            return self.campaign().await;
        }
        if let AdminRequest::Probe = req {
            let membership = self.inner.sm.membership();
            return Ok(AdminResponse::Probe {
                initialized: self.inner.log.has_state(),
                cluster_id: self.cluster_id(),
                members: self.inner.sm.members(),
                voters: membership.membership().voter_ids().collect(),
            });
        }
        if self.leader() != Some(self.id()) {
            return Err(StoreError::NotLeader { leader: self.leader() });
        }
        let _serial = self.inner.admin.lock().await;
        let raft = &self.inner.raft;
        let membership = raft.metrics().borrow().membership_config.clone();
        let nodes: BTreeMap<NodeId, Node> = membership.membership().nodes().map(|(id, n)| (*id, n.clone())).collect();
        let voters: BTreeSet<NodeId> = membership.membership().voter_ids().collect();
        match req {
            AdminRequest::Probe
            | AdminRequest::Campaign
            | AdminRequest::LeaseKeepAlive { .. }
            | AdminRequest::LeaseTimeToLive { .. } => {
                unreachable!("handled above")
            }
            AdminRequest::Join { info, timeout_ms } => {
                let published = self.inner.sm.members().into_iter().find(|m| m.id == info.id);
                if let Some(p) = published {
                    if nodes.contains_key(&info.id) && p.incarnation != info.incarnation {
                        return Err(StoreError::MemberExists {
                            id: info.id,
                            reason: format!(
                                "member {} already exists in the cluster (as {:?}); a member whose data was lost \
                                 must be removed and join with a new id",
                                info.id, p.name
                            ),
                        });
                    }
                }
                let addr = info
                    .peer_urls
                    .first()
                    .map(|u| u.trim_start_matches("http://").to_string())
                    .ok_or_else(|| StoreError::InvalidArgument("join request without a peer URL".into()))?;
                let node = Node { addr };
                let timeout = Duration::from_millis(timeout_ms);
                // A member an operator registered beforehand (etcd's
                // `member add`) keeps the role given then: a learner stays a
                // learner until `member promote`.
                let registered = nodes.contains_key(&info.id);
                if !registered {
                    retry_in_progress(|| raft.add_learner(info.id, node.clone(), false)).await?;
                }
                // Wait until the member has caught up before it may vote.
                wait_caught_up(raft, info.id, timeout).await?;
                if !registered {
                    retry_in_progress(|| {
                        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([info.id])), false)
                    })
                    .await?;
                }
                Ok(AdminResponse::Joined { cluster_id: self.cluster_id() })
            }
            AdminRequest::Add { peer_addr, learner } => {
                if nodes.values().any(|n| n.addr == peer_addr) {
                    return Err(StoreError::MemberExists {
                        id: 0,
                        reason: "etcdserver: Peer URLs already exists".into(),
                    });
                }
                let known = self.inner.sm.members().iter().map(|m| m.id).chain(nodes.keys().copied()).max();
                let id = known.unwrap_or(0) + 1;
                let node = Node { addr: peer_addr };
                retry_in_progress(|| raft.add_learner(id, node.clone(), false)).await?;
                if !learner {
                    retry_in_progress(|| {
                        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                    })
                    .await?;
                }
                Ok(AdminResponse::Added { id })
            }
            AdminRequest::Promote { id } => {
                if !nodes.contains_key(&id) {
                    return Err(StoreError::MemberNotFound { id });
                }
                if voters.contains(&id) {
                    return Err(StoreError::FailedPrecondition("etcdserver: can only promote a learner member".into()));
                }
                if !is_caught_up(raft, id) {
                    return Err(StoreError::FailedPrecondition(
                        "etcdserver: can only promote a learner member which is in sync with leader".into(),
                    ));
                }
                retry_in_progress(|| raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false))
                    .await?;
                Ok(AdminResponse::Done)
            }
            AdminRequest::Remove { id } => {
                if !nodes.contains_key(&id) {
                    return Err(StoreError::MemberNotFound { id });
                }
                if voters.contains(&id) {
                    if voters.len() == 1 {
                        return Err(StoreError::FailedPrecondition(
                            "etcdserver: cannot remove the last voting member".into(),
                        ));
                    }
                    retry_in_progress(|| {
                        raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                    })
                    .await?;
                }
                retry_in_progress(|| raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false))
                    .await?;
                Ok(AdminResponse::Done)
            }
            AdminRequest::Update { id, peer_addr } => {
                if !nodes.contains_key(&id) {
                    return Err(StoreError::MemberNotFound { id });
                }
                if nodes.iter().any(|(other, n)| *other != id && n.addr == peer_addr) {
                    return Err(StoreError::MemberExists {
                        id: 0,
                        reason: "etcdserver: Peer URLs already exists".into(),
                    });
                }
                // The new address goes through the log like any membership
                // change; every member replicates to it from then on. The
                // member itself must listen there (restart it with the new
                // `--peer-listen`); its data and identity stay.
                let node = Node { addr: peer_addr };
                retry_in_progress(|| {
                    raft.change_membership(ChangeMembers::SetNodes(BTreeMap::from([(id, node.clone())])), false)
                })
                .await?;
                Ok(AdminResponse::Done)
            }
        }
    }
}

/// Retries a membership change while another one is still in flight.
async fn retry_in_progress<F, Fut>(mut f: F) -> Result<(), StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<
        Output = Result<
            openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
            RaftError<NodeId, ClientWriteError<NodeId, Node>>,
        >,
    >,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Ok(_) => return Ok(()),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                let msg = e.to_string();
                if msg.contains("in progress") || msg.contains("InProgress") {
                    if Instant::now() > deadline {
                        return Err(StoreError::Unavailable(msg));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                return Err(StoreError::FailedPrecondition(msg));
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                return Err(StoreError::NotLeader { leader: f.leader_id })
            }
            Err(e) => return Err(StoreError::raft("membership change", e)),
        }
    }
}

/// A learner counts as caught up when it is within this many entries of the
/// leader's log.
const CAUGHT_UP_ENTRIES: u64 = 100;

fn is_caught_up(raft: &Raft, id: NodeId) -> bool {
    let m = raft.metrics().borrow().clone();
    let last = m.last_log_index.unwrap_or(0);
    let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten()).map_or(0, |l| l.index);
    matched + CAUGHT_UP_ENTRIES >= last && matched > 0
}

async fn wait_caught_up(raft: &Raft, id: NodeId, timeout: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + timeout;
    while !is_caught_up(raft, id) {
        if Instant::now() > deadline {
            return Err(StoreError::Unavailable(format!(
                "member {id} did not catch up with the leader within {timeout:?}; is its peer address reachable?"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
