//! [`Store`]: one member of the replicated store, the handle every server
//! in the process uses.
//!
//! Writes: any member accepts them; the leader batches them into Raft
//! entries, a follower forwards them (see `write`). Reads: linearizable by
//! default through a read barrier, or served from local state (see `read`).
//!
//! # Layout
//! - [`config`]: [`StoreConfig`] and [`Retention`].
//! - [`identity`]: the data directory's identity file.
//! - `bootstrap`: initializing, joining, publishing this member.
//! - `write`: the batcher and the forwarder.
//! - `read`: the read barrier, point-in-time reads, history and change feeds.
//! - `admin`: membership changes on the leader.
//! - `auth`: the replicated auth store and the auth tokens.
//! - `transfer`: handing leadership to another member (etcd's MoveLeader).
//! - `leases`: lease grants, revokes and the leader's expiry loop.
//! - `maintenance`: alarms, automatic compaction, snapshots, the election
//!   watchdog.
//!
//! Every long-lived task runs on the store's [`Shutdown`]: it ends once the
//! store shuts down, and [`Store::shutdown`] waits for it.

mod admin;
mod auth;
mod bootstrap;
pub mod config;
pub mod identity;
mod leases;
mod maintenance;
mod read;
mod transfer;
mod write;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use skiff_shutdown::Shutdown;
use tokio::sync::{mpsc, Mutex};

pub use admin::{AdminRequest, AdminResponse, MemberView};
pub use config::{Retention, StoreConfig};
pub use identity::{cluster_id_of, DataDirIdentity};
pub use transfer::{grpc_timeout, TransferError};

use crate::lessor::Lessor;
use crate::log_store::LogStore;
use crate::network::PeerClients;
use crate::state_machine::StateMachine;
use crate::types::{Node, NodeId, Raft};
use identity::{load_identity, IDENTITY_FILE};
use leases::run_lease_expiry;
use maintenance::{run_alarm_clearer, run_compactor, run_election_watchdog, run_snapshot_trigger};
use read::{run_read_barrier, ReadWaiter};
use transfer::Hold;
use write::{run_batcher, run_forwarder, PendingForward, PendingWrite};

/// Why a member could not start. Each is one line for the operator; the
/// underlying error stays available as the source.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory cannot be used (another member's, not Skiff's).
    #[error("data dir {path}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    /// Reading or writing the data directory failed.
    #[error("data dir {path}: {source}")]
    DataDirIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The state machine, the log or Raft's storage could not be opened.
    #[error("{0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Initializing the founding membership failed.
    #[error("initialize: {0}")]
    Initialize(#[source] RaftError<NodeId, InitializeError<NodeId, Node>>),
    #[error("bad configuration: {0}")]
    Config(String),
    /// openraft refused the timing configuration.
    #[error("bad configuration: {0}")]
    RaftConfig(#[source] openraft::ConfigError),
    #[error("refused: {0}")]
    Refused(String),
    #[error("join failed: {0}")]
    Join(#[source] crate::join::JoinError),
}

/// Raft status of this member, for `endpoint status` and `skiffctl status`.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    pub id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// The log index the newest snapshot covers (0: none yet).
    pub snapshot_index: u64,
    /// The last log index purged from this member's log (0: none yet): a
    /// follower behind it can only catch up from a snapshot.
    pub purged_index: u64,
    pub revision: i64,
    pub compacted: i64,
    pub db_size: u64,
    pub is_learner: bool,
    pub state: String,
}

/// The response header etcd puts on every response.
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: NodeId,
    pub revision: i64,
    pub raft_term: u64,
}

struct Inner {
    config: StoreConfig,
    identity: std::sync::Mutex<DataDirIdentity>,
    raft: Raft,
    sm: StateMachine,
    log: LogStore,
    peers: PeerClients,
    writes: mpsc::Sender<PendingWrite>,
    forwards: mpsc::Sender<PendingForward>,
    reads: mpsc::Sender<ReadWaiter>,
    /// Whether this run created the data directory (so a failed bootstrap
    /// may remove it again, leaving nothing that would later pass for a
    /// member's state).
    created_data_dir: bool,
    /// openraft allows one membership change at a time (and none during a
    /// leadership transfer).
    admin: Mutex<()>,
    /// Set while a leadership transfer holds this leader's writes and reads.
    hold: tokio::sync::watch::Sender<bool>,
    /// Lease expiry clocks, kept while this member leads.
    lessor: Arc<Lessor>,
    /// Set once the member begins to stop: long-lived client streams
    /// (watches, lease keep-alives) end instead of holding the shutdown up.
    stopping: tokio::sync::watch::Sender<bool>,
    /// A proposal raising this member's NOSPACE alarm is in flight.
    raising_nospace: std::sync::atomic::AtomicBool,
    /// Every task this member started; [`Store::shutdown`] stops them and
    /// waits for them.
    tasks: Shutdown,
    /// The auth tokens this member accepts: made up here or by another
    /// member, registered by the state machine as it applies them.
    tokens: Arc<crate::auth::token::Tokens>,
}

/// Spawns one of the store's tasks on `tasks`: it ends at its next await
/// once the store shuts down, and the shutdown waits for it.
fn spawn_task(tasks: &Shutdown, task: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
    let stop = tasks.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = task => {}
        }
    })
}

/// A member of the replicated store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl Store {
    /// Opens the member's storage and starts Raft. Call [`Store::bootstrap`]
    /// once the peer listener is serving.
    pub async fn open(config: StoreConfig) -> Result<Store, StartError> {
        Store::open_within(config, &Shutdown::new()).await
    }

    /// [`Store::open`], with the store's tasks on a child of `parent`:
    /// stopping the parent also stops them and waits for them.
    pub async fn open_within(config: StoreConfig, parent: &Shutdown) -> Result<Store, StartError> {
        let tasks = parent.child();
        if config.election_timeout_max < config.election_timeout_min * 2 {
            return Err(StartError::Config(
                "the election timeout range must be at least 2x wide (max >= 2 * min)".into(),
            ));
        }
        if config.election_timeout_min <= config.heartbeat {
            return Err(StartError::Config("the election timeout must exceed the heartbeat interval".into()));
        }
        let fresh_dir = !config.data_dir.join(IDENTITY_FILE).exists();
        if fresh_dir && config.initial_cluster.is_empty() && config.join.is_none() {
            return Err(StartError::Config("a fresh data dir needs --initial-cluster or --join".into()));
        }
        if config.restore_from.is_some() && (!fresh_dir || config.initial_cluster.is_empty()) {
            return Err(StartError::Config(
                "--restore-from founds a new cluster: it needs a fresh data dir and --initial-cluster".into(),
            ));
        }
        let (identity, created) = load_identity(&config)?;
        if let Some(backup) = &config.restore_from {
            StateMachine::restore(&config.data_dir, backup).map_err(|e| {
                let _ = std::fs::remove_dir_all(&config.data_dir);
                StartError::Storage(e.into())
            })?;
        }
        let log =
            LogStore::open(&config.data_dir.join("raft-log"), config.id).map_err(|e| StartError::Storage(e.into()))?;
        let sm = StateMachine::open(&config.data_dir).map_err(|e| StartError::Storage(e.into()))?;
        // The leader's entries reach its own disk while they replicate; none
        // is applied (answered, published) before it is on disk here too.
        sm.gate_applies_on(log.durable());
        let tokens = Arc::new(crate::auth::token::Tokens::new(config.auth_token_ttl));
        sm.register_tokens_in(tokens.clone());
        let raft_config = openraft::Config {
            cluster_name: "skiff".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout_min.as_millis() as u64,
            election_timeout_max: config.election_timeout_max.as_millis() as u64,
            install_snapshot_timeout: 30_000,
            // Snapshots are triggered by `run_snapshot_trigger`, on entries
            // and on bytes.
            snapshot_policy: SnapshotPolicy::Never,
            // Entries kept behind a snapshot so that a follower slightly
            // behind is served from the log, not a whole snapshot.
            max_in_snapshot_log_to_keep: (config.snapshot_logs / 2).min(5_000),
            max_payload_entries: 256,
            snapshot_max_chunk_size: 4 * 1024 * 1024,
            ..Default::default()
        }
        .validate()
        .map_err(StartError::RaftConfig)?;
        let peers = PeerClients::new(config.id, config.peer_filter.clone()).with_tls(config.peer_tls.clone());
        let raft = Raft::new(config.id, Arc::new(raft_config), peers.clone(), log.clone(), sm.clone())
            .await
            .map_err(|e| StartError::Storage(e.into()))?;

        let (writes, write_rx) = mpsc::channel(16 * 1024);
        let (reads, read_rx) = mpsc::channel(16 * 1024);
        let (forwards, forward_rx) = mpsc::channel(16 * 1024);
        let (hold, held) = Hold::new();
        spawn_task(
            &tasks,
            run_batcher(raft.clone(), write_rx, config.max_batch, config.max_in_flight, held.clone(), tasks.clone()),
        );
        spawn_task(
            &tasks,
            run_read_barrier(raft.clone(), peers.clone(), config.id, config.request_timeout, held, read_rx),
        );
        spawn_task(&tasks, run_election_watchdog(raft.clone(), config.election_timeout_max));
        let lessor = Arc::new(Lessor::default());
        let store = Store {
            inner: Arc::new(Inner {
                tokens,
                config,
                identity: std::sync::Mutex::new(identity),
                raft,
                sm,
                log,
                peers,
                writes,
                forwards,
                reads,
                created_data_dir: created,
                admin: Mutex::new(()),
                hold,
                lessor,
                stopping: tokio::sync::watch::Sender::new(false),
                raising_nospace: std::sync::atomic::AtomicBool::new(false),
                tasks,
            }),
        };
        store.spawn(run_forwarder(Arc::downgrade(&store.inner), forward_rx));
        store.spawn(run_lease_expiry(Arc::downgrade(&store.inner)));
        store.spawn(run_compactor(Arc::downgrade(&store.inner)));
        store.spawn(run_alarm_clearer(Arc::downgrade(&store.inner)));
        store.spawn(run_snapshot_trigger(Arc::downgrade(&store.inner)));
        Ok(store)
    }

    pub fn id(&self) -> NodeId {
        self.inner.config.id
    }

    /// Whether this run created the data directory.
    pub fn created_data_dir(&self) -> bool {
        self.inner.created_data_dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    pub(crate) fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub(crate) fn state_machine(&self) -> &StateMachine {
        &self.inner.sm
    }

    pub fn cluster_id(&self) -> u64 {
        self.inner.identity.lock().expect("poisoned").cluster_id
    }

    fn incarnation(&self) -> u64 {
        self.inner.identity.lock().expect("poisoned").incarnation
    }

    /// The header for a response, at the current applied revision.
    pub fn header(&self) -> Header {
        // Only the term is needed: no clone of the whole metrics struct.
        let raft_term = self.inner.raft.metrics().borrow().current_term;
        Header { cluster_id: self.cluster_id(), member_id: self.id(), revision: self.inner.sm.revision(), raft_term }
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// Spawns a task that [`Store::shutdown`] stops and waits for.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        spawn_task(&self.inner.tasks, task);
    }

    /// Spawns a client stream's task (a watch, a keep-alive, a snapshot
    /// download): [`Store::shutdown`] stops it and waits for it; the handle
    /// aborts it earlier (a cancelled watch).
    pub(crate) fn spawn_stream(&self, task: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
        spawn_task(&self.inner.tasks, task)
    }

    fn leader_addr(&self, leader: NodeId) -> Option<String> {
        leader_addr(&self.inner.raft, leader)
    }

    /// Raft status of this member.
    pub fn status(&self) -> MemberStatus {
        let m = self.inner.raft.metrics().borrow().clone();
        let is_learner = !m.membership_config.membership().voter_ids().any(|v| v == self.id());
        MemberStatus {
            id: self.id(),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            revision: self.inner.sm.revision(),
            compacted: self.inner.sm.compacted(),
            db_size: self.inner.sm.db_size(),
            is_learner,
            state: format!("{:?}", m.state),
        }
    }

    /// Announces that the member is stopping: see [`Store::stopping`].
    pub fn begin_stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Becomes true once the member begins to stop. Client streams that
    /// would otherwise stay open until the client leaves (watches, lease
    /// keep-alives) end on it, so that a graceful shutdown does not wait out
    /// its grace period for them; clients reconnect to another member.
    pub fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.stopping.subscribe()
    }

    /// Stops the tasks [`Store::open`] started and waits for them, then
    /// stops Raft; the store answers nothing afterwards. Writes waiting in
    /// the batcher or the forwarder fail with `Unavailable`.
    pub async fn shutdown(&self) {
        self.inner.tasks.stop().await;
        let _ = self.inner.raft.shutdown().await;
    }

    /// How many of the tasks [`Store::open`] started are still running.
    pub fn running_tasks(&self) -> usize {
        self.inner.tasks.running()
    }
}

fn leader_addr(raft: &Raft, leader: NodeId) -> Option<String> {
    raft.metrics().borrow().membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_stops_and_waits_for_every_task_open_started() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A single founding member: it initializes alone, no peer listener needed.
        let mut config = StoreConfig::new(1, dir.path().join("member"), "127.0.0.1:1".into());
        config.initial_cluster = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        let store = Store::open(config).await.expect("open");
        store.bootstrap().await.expect("bootstrap");
        // A write goes through the batcher: the loops are running.
        store.lease_grant(0, 30).await.expect("a write on the only member");
        assert!(store.running_tasks() >= 8, "open started its loops: {}", store.running_tasks());
        tokio::time::timeout(Duration::from_secs(10), store.shutdown()).await.expect("shutdown ends");
        assert_eq!(store.running_tasks(), 0);
    }
}
