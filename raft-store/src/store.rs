//! [`Store`]: one member of the replicated store, the handle every server
//! in the process uses.
//!
//! Writes: any member accepts them. The leader's batcher drains every write
//! waiting at that moment into one Raft entry (openraft 0.9 fsyncs once per
//! `client_write`), with up to `max_in_flight` entries in flight; a follower
//! forwards the write to the leader over the peer channel. Each write has a
//! [`RequestId`] fixed when it first arrives, so a retry after a failover is
//! applied once (the state machine remembers recent ids).
//!
//! Reads: linearizable by default. A read barrier coalesces every read
//! waiting at that moment into one `ensure_linearizable` round on the leader
//! (a follower asks the leader for that read index, then waits until it has
//! applied it locally). Serializable reads are served from local state.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use skiff_shutdown::Shutdown;
use tokio::sync::{mpsc, oneshot, Mutex, Semaphore};

use crate::changes::{Changes, ChangesSince, History};
use crate::error::StoreError;
use crate::lessor::{Lessor, EXPIRY_CHECK, MIN_TTL_SECONDS};
use crate::log_store::LogStore;
use crate::mvcc::{ReadError, Reader};
use crate::network::{PeerClients, PeerMethod};
use crate::state_machine::{write_durably, StateMachine};
use crate::types::{
    now_ms, Alarm, AlarmKind, ApplyError, Batch, Command, MemberInfo, Node, NodeId, Output, Proposal, ProposalResult,
    Raft, RangeRequest, RangeResult, RequestId,
};

/// Everything a member needs to start.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub id: NodeId,
    pub name: String,
    pub data_dir: PathBuf,
    /// The peer address others reach this member at.
    pub peer_addr: String,
    /// The client URLs published to the cluster.
    pub client_urls: Vec<String>,
    /// `id -> peer address` of the founding members, for a fresh bootstrap.
    pub initial_cluster: BTreeMap<NodeId, String>,
    /// A member's client address to join through, for a fresh member.
    pub join: Option<String>,
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot (and purge the log) after this many entries, or
    /// after [`StoreConfig::snapshot_log_bytes`], whichever comes first.
    pub snapshot_logs: u64,
    /// Build a snapshot once this many bytes of entries were appended since
    /// the last one, or as many as the state machine's database holds if
    /// that is more: a snapshot copies the whole database, so one taken for
    /// bytes copies at most a byte per byte written.
    pub snapshot_log_bytes: u64,
    pub join_timeout: Duration,
    pub request_timeout: Duration,
    /// Most proposals the leader puts in one Raft entry.
    pub max_batch: usize,
    /// Raft entries the leader's batcher keeps in flight at once. One is
    /// best measured: every entry costs a log append, an fsync round, an
    /// AppendEntries round and an apply on each member whatever its size, so
    /// writes that arrive while an entry is in flight are worth more as the
    /// next entry than as entries of their own. On 3 members (members' CPU
    /// per write, alternating runs): 256 clients 74.6 -> 66.3 us and 18.3k ->
    /// 20.2k writes/s; 16 clients 6.6k -> 8.5k writes/s. At 4 clients one
    /// in flight loses about 10% (3.3k -> 3.0k); at 1 client nothing
    /// changes. Two in flight measured in between at 16 and 256 clients.
    pub max_in_flight: usize,
    /// How much history the leader keeps before compacting automatically.
    pub history_retention: Retention,
    /// Writes that add data are refused while the state-machine database
    /// is larger than this (etcd's `--quota-backend-bytes`).
    pub quota_backend_bytes: u64,
    /// Seed a fresh data dir from this backup before founding a cluster.
    pub restore_from: Option<PathBuf>,
}

/// Automatic compaction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Keep every revision until a client compacts.
    Unlimited,
    /// Keep the latest this many revisions.
    Revisions(i64),
    /// Keep the revisions of this long.
    Duration(Duration),
}

impl std::str::FromStr for Retention {
    type Err = String;

    /// `0` or `unlimited`; a number of revisions (`10000`); or a duration
    /// with a unit (`90m`, `24h`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "0" | "unlimited" | "" => Ok(Retention::Unlimited),
            t => match t.parse::<i64>() {
                Ok(n) if n > 0 => Ok(Retention::Revisions(n)),
                Ok(_) => Err("a revision count must be positive".into()),
                Err(_) => parse_duration(t).map(Retention::Duration),
            },
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| format!("{s:?} needs a unit (s, m, h, d)"))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid retention {s:?}"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("invalid retention unit {unit:?} in {s:?} (use s, m, h or d)")),
    };
    Ok(Duration::from_secs(secs))
}

impl StoreConfig {
    pub fn new(id: NodeId, data_dir: PathBuf, peer_addr: String) -> Self {
        StoreConfig {
            id,
            name: format!("member-{id}"),
            data_dir,
            peer_addr,
            client_urls: Vec::new(),
            initial_cluster: BTreeMap::new(),
            join: None,
            heartbeat: Duration::from_millis(100),
            // openraft 0.9 campaigns after `max + U[min, max)` without a
            // heartbeat: 200-400 ms gives ~0.6-0.8 s plus a vote round.
            election_timeout_min: Duration::from_millis(200),
            election_timeout_max: Duration::from_millis(400),
            // etcd's default `--snapshot-count`.
            snapshot_logs: 100_000,
            snapshot_log_bytes: 64 << 20,
            join_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            max_batch: 2048,
            max_in_flight: 1,
            history_retention: Retention::Unlimited,
            quota_backend_bytes: 8 * 1024 * 1024 * 1024,
            restore_from: None,
        }
    }
}

/// Why a member could not start. Each is one line for the operator.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data dir {path}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    #[error("{0}")]
    Storage(String),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("join failed: {0}")]
    Join(String),
}

/// The identity of a data directory, written once when it is created.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataDirIdentity {
    pub id: NodeId,
    pub cluster_id: u64,
    /// Random per data directory; see [`MemberInfo::incarnation`].
    pub incarnation: u64,
}

const IDENTITY_FILE: &str = "skiff-member.json";

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

/// Raft status of this member, for `endpoint status` and `skiffctl status`.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    pub id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
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

struct PendingWrite {
    proposal: Proposal,
    reply: oneshot::Sender<Result<ProposalResult, StoreError>>,
}

/// A write a follower sends on to the leader (see [`run_forwarder`]).
struct PendingForward {
    leader: NodeId,
    write: PendingWrite,
    deadline: Instant,
}

type ReadWaiter = oneshot::Sender<Result<u64, StoreError>>;

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
    /// openraft allows one membership change at a time.
    admin: Mutex<()>,
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
}

/// Spawns one of the store's tasks on `tasks`: it ends at its next await
/// once the store shuts down, and the shutdown waits for it.
fn spawn_task(tasks: &Shutdown, task: impl Future<Output = ()> + Send + 'static) {
    let stop = tasks.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = task => {}
        }
    });
}

/// A member of the replicated store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// Cluster id of a bootstrapped cluster: every founding member derives the
/// same one from the founding membership (FNV-1a).
pub fn cluster_id_of(initial: &BTreeMap<NodeId, String>) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for (id, addr) in initial {
        for b in format!("{id}={addr},").bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

fn load_identity(config: &StoreConfig) -> Result<(DataDirIdentity, bool), StartError> {
    let dir = &config.data_dir;
    let bad = |reason: String| StartError::DataDir { path: dir.clone(), reason };
    let path = dir.join(IDENTITY_FILE);
    if path.exists() {
        let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let identity: DataDirIdentity = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("{IDENTITY_FILE} is corrupt ({e}); refusing to touch this directory")))?;
        if identity.id != config.id {
            return Err(bad(format!("belongs to member {}, not member {}", identity.id, config.id)));
        }
        return Ok((identity, false));
    }
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| bad(e.to_string()))?;
        if entries.next().is_some() {
            return Err(bad(format!(
                "is not empty and has no {IDENTITY_FILE}: not a Skiff data directory; refusing to use it"
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
    let cluster_id = if config.initial_cluster.is_empty() { 0 } else { cluster_id_of(&config.initial_cluster) };
    let identity = DataDirIdentity { id: config.id, cluster_id, incarnation: rand::random() };
    save_identity(dir, &identity).map_err(|e| bad(e.to_string()))?;
    Ok((identity, true))
}

fn save_identity(dir: &std::path::Path, identity: &DataDirIdentity) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(identity).map_err(std::io::Error::other)?;
    write_durably(&dir.join(IDENTITY_FILE), &bytes)
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
                StartError::Storage(e.to_string())
            })?;
        }
        let log = LogStore::open(&config.data_dir.join("raft-log"), config.id)
            .map_err(|e| StartError::Storage(e.to_string()))?;
        let sm = StateMachine::open(&config.data_dir).map_err(|e| StartError::Storage(e.to_string()))?;
        // The leader's entries reach its own disk while they replicate; none
        // is applied (answered, published) before it is on disk here too.
        sm.gate_applies_on(log.durable());
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
        .map_err(|e| StartError::Config(e.to_string()))?;
        let peers = PeerClients::default();
        let raft = Raft::new(config.id, Arc::new(raft_config), peers.clone(), log.clone(), sm.clone())
            .await
            .map_err(|e| StartError::Storage(e.to_string()))?;

        let (writes, write_rx) = mpsc::channel(16 * 1024);
        let (reads, read_rx) = mpsc::channel(16 * 1024);
        let (forwards, forward_rx) = mpsc::channel(16 * 1024);
        spawn_task(&tasks, run_batcher(raft.clone(), write_rx, config.max_batch, config.max_in_flight, tasks.clone()));
        spawn_task(&tasks, run_read_barrier(raft.clone(), peers.clone(), config.id, config.request_timeout, read_rx));
        spawn_task(&tasks, run_election_watchdog(raft.clone(), config.election_timeout_max));
        let lessor = Arc::new(Lessor::default());
        let store = Store {
            inner: Arc::new(Inner {
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
        spawn_task(&self.inner.tasks, task)
    }

    fn leader_addr(&self, leader: NodeId) -> Option<String> {
        leader_addr(&self.inner.raft, leader)
    }

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
            let probe: Result<Result<AdminResponse, StoreError>, _> = self
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
                .map_err(|e| StartError::DataDir { path: config.data_dir.clone(), reason: e.to_string() })?;
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
            Err(e) => Err(StartError::Storage(format!("initialize: {e}"))),
        }
    }

    async fn join(&self, client_addr: &str) -> Result<(), StartError> {
        let config = &self.inner.config;
        let info = self.member_info();
        let cluster_id =
            crate::join::request_join(client_addr, &info, config.join_timeout).await.map_err(StartError::Join)?;
        let mut identity = self.inner.identity.lock().expect("poisoned").clone();
        identity.cluster_id = cluster_id;
        save_identity(&config.data_dir, &identity)
            .map_err(|e| StartError::DataDir { path: config.data_dir.clone(), reason: e.to_string() })?;
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

    // ----------------------------------------------------------------- writes

    /// Replicates `command` and returns its result. Retries across leader
    /// changes with the same request id until `request_timeout`.
    pub async fn write(&self, command: Command) -> Result<Output, StoreError> {
        if command.adds_data() && self.over_quota() {
            self.raise_nospace();
            return Err(StoreError::NoSpace);
        }
        let proposal = Proposal { id: RequestId::fresh(), command };
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let attempt = match self.leader() {
                Some(l) if l == self.id() => self.submit_local(vec![proposal.clone()]).await.pop(),
                Some(l) => Some(self.forward_one(l, proposal.clone(), deadline).await),
                None => Some(Err(StoreError::NoLeader)),
            };
            let result = attempt.unwrap_or_else(|| Err(StoreError::Internal("empty response".into())));
            match result {
                Ok(Err(ApplyError::NoSpace)) => return Err(StoreError::NoSpace),
                Ok(r) => return r.map_err(StoreError::Apply),
                Err(e) if e.is_retryable() && Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, id = %proposal.id, "write will be retried");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(e) if e.is_retryable() => return Err(StoreError::Timeout),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether this member's database is over `--quota-backend-bytes`.
    pub fn over_quota(&self) -> bool {
        self.inner.sm.db_size() > self.inner.config.quota_backend_bytes
    }

    // ---------------------------------------------------------------- alarms
    //
    // As in etcd, a member that finds its database over the quota when a
    // write arrives refuses the write and raises a NOSPACE alarm through the
    // log, so every member lists it and refuses writes that add data until
    // it is cleared. Unlike etcd, a member also clears its own alarm once
    // compaction has brought its database back under the quota (see
    // `run_alarm_clearer`): no `etcdctl alarm disarm` is needed, though it
    // works too.

    /// Proposes this member's NOSPACE alarm unless it is raised already or
    /// being raised. Does not wait for it.
    fn raise_nospace(&self) {
        use std::sync::atomic::Ordering;
        let alarm = Alarm { member: self.id(), kind: AlarmKind::NoSpace };
        if self.alarms().is_ok_and(|raised| raised.contains(&alarm))
            || self.inner.raising_nospace.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let store = self.clone();
        self.spawn(async move {
            match store.change_alarm(alarm, true).await {
                Ok(_) => tracing::warn!(
                    quota = store.inner.config.quota_backend_bytes,
                    db_size = store.inner.sm.db_size(),
                    "database over --quota-backend-bytes: raised the NOSPACE alarm"
                ),
                Err(e) => tracing::warn!(error = %e, "raising the NOSPACE alarm failed; the next write retries"),
            }
            store.inner.raising_nospace.store(false, Ordering::Release);
        });
    }

    /// The raised alarms in this member's applied state, sorted.
    pub fn alarms(&self) -> Result<Vec<Alarm>, StoreError> {
        let db = self.inner.sm.db();
        let alarms = Reader::snapshot(&db).alarms().map_err(|e| StoreError::Internal(e.to_string()));
        alarms
    }

    /// Raises or clears `alarm` for the whole cluster; returns the alarms
    /// that changed (none if it already was as asked).
    pub async fn change_alarm(&self, alarm: Alarm, raise: bool) -> Result<Vec<Alarm>, StoreError> {
        match self.write(Command::Alarm { alarm, raise }).await? {
            Output::Alarm { changed } => Ok(changed),
            other => Err(StoreError::Internal(format!("unexpected answer to an alarm: {other:?}"))),
        }
    }

    /// Hands proposals to this member's batcher (which succeeds only while
    /// this member is the leader).
    pub async fn submit_local(&self, proposals: Vec<Proposal>) -> Vec<Result<ProposalResult, StoreError>> {
        let mut replies = Vec::with_capacity(proposals.len());
        for proposal in proposals {
            let (reply, rx) = oneshot::channel();
            if self.inner.writes.send(PendingWrite { proposal, reply }).await.is_err() {
                replies.push(None);
            } else {
                replies.push(Some(rx));
            }
        }
        let mut out = Vec::with_capacity(replies.len());
        for rx in replies {
            out.push(match rx {
                Some(rx) => rx.await.unwrap_or_else(|_| Err(StoreError::Unavailable("store is shutting down".into()))),
                None => Err(StoreError::Unavailable("store is shutting down".into())),
            });
        }
        out
    }

    /// Sends one write on to the leader, together with the others waiting
    /// at that moment (see [`run_forwarder`]).
    async fn forward_one(
        &self,
        leader: NodeId,
        proposal: Proposal,
        deadline: Instant,
    ) -> Result<ProposalResult, StoreError> {
        let stopped = || StoreError::Unavailable("store is shutting down".into());
        let (reply, rx) = oneshot::channel();
        let forward = PendingForward { leader, write: PendingWrite { proposal, reply }, deadline };
        self.inner.forwards.send(forward).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    async fn forward(
        &self,
        leader: NodeId,
        proposals: Vec<Proposal>,
        deadline: Instant,
    ) -> Vec<Result<ProposalResult, StoreError>> {
        let n = proposals.len();
        let Some(addr) = self.leader_addr(leader) else {
            return vec![Err(StoreError::NoLeader); n];
        };
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let r: Result<Vec<Result<ProposalResult, StoreError>>, _> =
            self.inner.peers.call(&addr, leader, PeerMethod::Forward, &proposals, timeout).await;
        match r {
            Ok(results) => results,
            Err(e) => vec![Err(StoreError::Unavailable(e.to_string())); n],
        }
    }

    // ------------------------------------------------------------------ reads

    /// Waits until this member's state reflects every write acknowledged
    /// before the call (linearizable read).
    pub async fn linearize(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.reads.send(tx).await.map_err(|_| StoreError::Unavailable("store is shutting down".into()))?;
        let index = rx.await.map_err(|_| StoreError::Unavailable("store is shutting down".into()))??;
        tokio::time::timeout(self.inner.config.request_timeout, self.inner.sm.wait_applied(index))
            .await
            .map_err(|_| StoreError::Timeout)
    }

    /// The read index for a linearizable read, computed on the leader
    /// (called by followers over the peer channel).
    pub async fn read_index(&self) -> Result<u64, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.reads.send(tx).await.map_err(|_| StoreError::Unavailable("store is shutting down".into()))?;
        rx.await.map_err(|_| StoreError::Unavailable("store is shutting down".into()))?
    }

    /// etcd's Range.
    pub async fn range(&self, req: RangeRequest, serializable: bool) -> Result<(RangeResult, Header), StoreError> {
        if !serializable {
            self.linearize().await?;
        }
        self.read_view(move |view| view.range(&req)).await
    }

    /// etcd's HashKV on this member's state: (hash, compacted revision,
    /// revision hashed), with the header of the view hashed.
    pub async fn hash_kv(&self, revision: i64) -> Result<((u32, i64, i64), Header), StoreError> {
        self.read_view(move |view| view.hash_kv(revision)).await
    }

    /// etcd's Hash on this member's state, with the header of the view hashed.
    pub async fn hash_all(&self) -> Result<(u32, Header), StoreError> {
        self.read_view(|view| view.hash_all().map_err(ReadError::Engine)).await
    }

    /// Runs `read` on a point-in-time view of this member's state, on the
    /// blocking pool; the header carries the view's revision.
    async fn read_view<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Reader<'_>) -> Result<T, ReadError> + Send + 'static,
    ) -> Result<(T, Header), StoreError> {
        let sm = self.inner.sm.clone();
        let header = self.header();
        let result = tokio::task::spawn_blocking(move || {
            let db = sm.db();
            let view = Reader::snapshot(&db);
            let revision = view.revision();
            read(&view).map(|r| (r, revision))
        })
        .await
        .map_err(|e| StoreError::Internal(e.to_string()))?;
        match result {
            Ok((r, revision)) => Ok((r, Header { revision: revision.unwrap_or(header.revision), ..header })),
            Err(ReadError::Request(e)) => Err(StoreError::Apply(e)),
            Err(ReadError::Engine(e)) => Err(StoreError::Internal(e.to_string())),
        }
    }

    // ---------------------------------------------------------------- changes

    /// The revision of this member's applied state.
    pub fn revision(&self) -> i64 {
        self.inner.sm.revision()
    }

    /// The revision up to which this member's history is compacted.
    pub fn compacted(&self) -> i64 {
        self.inner.sm.compacted()
    }

    /// Waits until this member has applied `revision` (a read asking for
    /// "at least N" on a member that is behind).
    pub async fn wait_for_revision(&self, revision: i64) {
        let mut applied = self.inner.sm.applied();
        // The sender lives as long as the state machine, so this cannot fail.
        let _ = applied.wait_for(|a| a.revision >= revision).await;
    }

    /// `key`'s history on this member, from one point-in-time view.
    pub async fn history(&self, key: Vec<u8>) -> Result<History, StoreError> {
        crate::changes::read_history(&self.inner.sm, key).await
    }

    /// The revisions from `from` up to the current one, at most a chunk
    /// (call again from after the last one for more); `ApplyError::Compacted`
    /// if `from` is compacted away.
    pub async fn changes_since(&self, from: i64) -> Result<ChangesSince, StoreError> {
        crate::changes::read_changes(&self.inner.sm, from).await
    }

    /// A live feed of the revisions touching `[key, range_end)` (etcd's
    /// range rules) from `start`, or from after the current revision.
    pub fn subscribe(&self, key: &[u8], range_end: &[u8], start: Option<i64>) -> Changes {
        Changes::new(&self.inner.sm, key, range_end, start)
    }

    /// Live feeds following this member (see [`Store::subscribe`]).
    pub fn watchers(&self) -> usize {
        self.inner.sm.hub().watchers()
    }

    // ------------------------------------------------------------- membership

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
                        match self.inner.peers.call(&addr, l, PeerMethod::Admin, &req, left).await {
                            Ok(r) => r,
                            Err(e) => Err(StoreError::Unavailable(e.to_string())),
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
            AdminRequest::Probe | AdminRequest::LeaseKeepAlive { .. } | AdminRequest::LeaseTimeToLive { .. } => {
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

    // ----------------------------------------------------------------- leases

    /// etcd's LeaseGrant: `id` 0 lets this member choose one.
    pub async fn lease_grant(&self, id: i64, ttl_seconds: i64) -> Result<(i64, i64), StoreError> {
        if id < 0 {
            return Err(StoreError::InvalidArgument("etcdserver: lease ID must be positive".into()));
        }
        let id = if id == 0 { rand::random::<i64>() & i64::MAX } else { id };
        let ttl_seconds = ttl_seconds.max(MIN_TTL_SECONDS);
        match self.write(Command::LeaseGrant { id, ttl_seconds }).await? {
            Output::LeaseGranted { id, ttl_seconds } => Ok((id, ttl_seconds)),
            other => Err(StoreError::Internal(format!("unexpected result of a lease grant: {other:?}"))),
        }
    }

    /// etcd's LeaseRevoke. Returns the revision after the attached keys went.
    pub async fn lease_revoke(&self, id: i64) -> Result<i64, StoreError> {
        match self.write(Command::LeaseRevoke { id }).await? {
            Output::LeaseRevoked { revision } => Ok(revision),
            other => Err(StoreError::Internal(format!("unexpected result of a lease revoke: {other:?}"))),
        }
    }

    /// Restarts lease `id`'s clock on the leader; returns its TTL.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, StoreError> {
        match self.admin(AdminRequest::LeaseKeepAlive { id }).await? {
            AdminResponse::Lease { ttl_seconds, .. } => Ok(ttl_seconds),
            other => Err(StoreError::Internal(format!("unexpected keep-alive answer: {other:?}"))),
        }
    }

    /// Granted TTL and remaining seconds of lease `id`, from the leader's clock.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<(i64, i64), StoreError> {
        match self.admin(AdminRequest::LeaseTimeToLive { id }).await? {
            AdminResponse::Lease { ttl_seconds, remaining_seconds } => Ok((ttl_seconds, remaining_seconds)),
            other => Err(StoreError::Internal(format!("unexpected time-to-live answer: {other:?}"))),
        }
    }

    /// Every lease (id, granted TTL), from this member's applied state.
    pub fn leases(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        let db = self.inner.sm.db();
        let leases = Reader::snapshot(&db).leases().map_err(|e| StoreError::Internal(e.to_string()));
        leases
    }

    /// The keys attached to lease `id`, from this member's applied state.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, StoreError> {
        let db = self.inner.sm.db();
        let keys = Reader::snapshot(&db).lease_keys(id).map_err(|e| StoreError::Internal(e.to_string()));
        keys
    }

    /// On the leader: renew (or just read) lease `id`'s clock.
    fn lease_clock(&self, id: i64, renew: bool) -> Result<AdminResponse, StoreError> {
        if self.leader() != Some(self.id()) {
            return Err(StoreError::NotLeader { leader: self.leader() });
        }
        let db = self.inner.sm.db();
        let granted = Reader::snapshot(&db).lease(id).map_err(|e| StoreError::Internal(e.to_string()))?;
        let Some(granted) = granted else {
            return Err(StoreError::Apply(crate::types::ApplyError::LeaseNotFound { id }));
        };
        let now = Instant::now();
        if renew {
            self.inner.lessor.renew(id, Some(granted), now);
        }
        let (ttl_seconds, remaining_seconds) = self.inner.lessor.remaining(id, now).unwrap_or((granted, granted));
        Ok(AdminResponse::Lease { ttl_seconds, remaining_seconds })
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
            Err(e) => return Err(StoreError::Unavailable(e.to_string())),
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

/// Bytes of proposals the leader puts in one Raft entry (a single larger
/// write still gets an entry of its own), so that entries stay small enough
/// to replicate and fsync within a heartbeat.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

fn proposal_size(p: &Proposal) -> usize {
    bincode::serialized_size(p).map_or(usize::MAX / 2, |n| n as usize)
}

/// Drains waiting writes into Raft entries, keeping up to `max_in_flight`
/// entries in flight; while they are, new writes queue up and form the next
/// batch.
async fn run_batcher(
    raft: Raft,
    mut rx: mpsc::Receiver<PendingWrite>,
    max_batch: usize,
    max_in_flight: usize,
    tasks: Shutdown,
) {
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    // A write that did not fit the previous entry opens the next one.
    let mut carry: Option<PendingWrite> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = proposal_size(&first.proposal);
        let mut pending = vec![first];
        while pending.len() < max_batch && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    let size = proposal_size(&p.proposal);
                    if bytes + size > MAX_BATCH_BYTES {
                        carry = Some(p);
                        break;
                    }
                    bytes += size;
                    pending.push(p);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        let m = crate::metrics::metrics();
        m.batch_size.observe(pending.len() as f64);
        m.proposals_pending.add(pending.len() as i64);
        let stop = tasks.clone();
        tasks.spawn(async move {
            // The proposals move into the entry; only the reply channels stay.
            let (proposals, replies): (Vec<_>, Vec<_>) = pending.into_iter().map(|p| (p.proposal, p.reply)).unzip();
            let write = raft.client_write(Batch { timestamp_ms: now_ms(), proposals: proposals.into() });
            let outcome = tokio::select! {
                outcome = write => Some(outcome),
                // The entry may still commit; its writers hear that the
                // store stopped, as after a timeout.
                _ = stop.cancelled() => None,
            };
            drop(slot);
            let Some(outcome) = outcome else {
                m.proposals_pending.sub(replies.len() as i64);
                return;
            };
            m.proposals_pending.sub(replies.len() as i64);
            match outcome {
                Ok(resp) => {
                    m.proposals_committed.inc_by(replies.len() as u64);
                    let mut results = resp.data.results.into_iter();
                    for reply in replies {
                        let r = results.next().ok_or_else(|| StoreError::Internal("missing result".into()));
                        let _ = reply.send(r);
                    }
                }
                Err(e) => {
                    m.proposals_failed.inc_by(replies.len() as u64);
                    let err = match e {
                        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                            StoreError::NotLeader { leader: f.leader_id }
                        }
                        other => StoreError::Unavailable(other.to_string()),
                    };
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

/// A follower's side of write batching: every write waiting to go to the
/// leader at that moment goes in one `Forward` call, which the leader's
/// batcher drains into one entry, instead of one call per write (whose
/// HTTP/2 framing and task hand-offs cost the leader more than the write
/// itself). Calls do not wait for each other.
async fn run_forwarder(inner: std::sync::Weak<Inner>, mut rx: mpsc::Receiver<PendingForward>) {
    let mut carry: Option<PendingForward> = None;
    loop {
        let first = match carry.take() {
            Some(f) => f,
            None => match rx.recv().await {
                Some(f) => f,
                // The store is gone.
                None => return,
            },
        };
        // The writes arriving with this one (the calls of a client
        // connection, which are polled together) queue up first.
        tokio::task::yield_now().await;
        let Some(inner) = inner.upgrade() else { return };
        let (leader, mut deadline) = (first.leader, first.deadline);
        let mut bytes = proposal_size(&first.write.proposal);
        let mut batch = vec![first.write];
        while batch.len() < inner.config.max_batch {
            let Ok(f) = rx.try_recv() else { break };
            let size = proposal_size(&f.write.proposal);
            if f.leader != leader || bytes + size > MAX_BATCH_BYTES {
                carry = Some(f);
                break;
            }
            bytes += size;
            deadline = deadline.max(f.deadline);
            batch.push(f.write);
        }
        // The call may run until the latest deadline of its writes: one
        // with an earlier deadline gets its answer late rather than a
        // spurious failure.
        crate::metrics::metrics().forward_batch_size.observe(batch.len() as f64);
        let store = Store { inner };
        store.spawn(async move {
            let (proposals, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.proposal, w.reply)).unzip();
            let mut results = store.forward(leader, proposals, deadline).await.into_iter();
            for reply in replies {
                let _ =
                    reply.send(results.next().unwrap_or_else(|| Err(StoreError::Internal("missing result".into()))));
            }
        });
    }
}

/// Serves linearizable reads: one quorum round (on the leader) or one read
/// index request (from a follower) for every read waiting at that moment.
async fn run_read_barrier(
    raft: Raft,
    peers: PeerClients,
    id: NodeId,
    timeout: Duration,
    mut rx: mpsc::Receiver<ReadWaiter>,
) {
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        let m = crate::metrics::metrics();
        m.read_rounds.inc();
        m.reads_linearized.inc_by(waiters.len() as u64);
        let result = read_index_once(&raft, &peers, id, timeout).await;
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}

async fn read_index_once(raft: &Raft, peers: &PeerClients, id: NodeId, timeout: Duration) -> Result<u64, StoreError> {
    let leader = raft.metrics().borrow().current_leader;
    match leader {
        Some(l) if l == id => match raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(e)) => match e {
                openraft::error::CheckIsLeaderError::ForwardToLeader(f) => {
                    Err(StoreError::NotLeader { leader: f.leader_id })
                }
                other => Err(StoreError::Unavailable(other.to_string())),
            },
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        },
        Some(l) => {
            let Some(addr) = leader_addr(raft, l) else { return Err(StoreError::NoLeader) };
            match peers.call::<(), Result<u64, StoreError>>(&addr, l, PeerMethod::ReadIndex, &(), timeout).await {
                Ok(r) => r,
                Err(e) => Err(StoreError::Unavailable(e.to_string())),
            }
        }
        None => Err(StoreError::NoLeader),
    }
}

/// While this member leads, keeps the lease clocks in step with the
/// replicated leases and proposes a revoke for each lease that expired.
async fn run_lease_expiry(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(EXPIRY_CHECK);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let metrics = store.inner.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(store.id()) {
            store.inner.lessor.clear();
            continue;
        }
        let Ok(leases) = store.leases() else { continue };
        let now = Instant::now();
        store.inner.lessor.sync(metrics.current_term, &leases, now);
        for id in store.inner.lessor.expired(now) {
            let task = store.clone();
            store.spawn(async move {
                let store = task;
                match store.write(Command::LeaseRevoke { id }).await {
                    Ok(_) => tracing::debug!(lease = id, "lease expired and was revoked"),
                    Err(StoreError::Apply(_)) => {}
                    Err(e) => tracing::warn!(lease = id, error = %e, "revoking an expired lease failed; will retry"),
                }
            });
        }
    }
}

/// How often a member checks whether its alarms can be cleared.
const ALARM_CHECK: Duration = Duration::from_secs(1);

/// Clears this member's NOSPACE alarm once its database is back under the
/// quota; the leader also clears the alarms of members that were removed
/// from the cluster (nothing else ever would).
async fn run_alarm_clearer(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(ALARM_CHECK);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let Ok(raised) = store.alarms() else { continue };
        if raised.is_empty() {
            continue;
        }
        store.inner.sm.refresh_db_size();
        let leads = store.leader() == Some(store.id());
        let members = store
            .inner
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect::<BTreeSet<_>>();
        for alarm in raised {
            let clear = match alarm.kind {
                AlarmKind::NoSpace if alarm.member == store.id() => !store.over_quota(),
                _ => leads && !members.contains(&alarm.member),
            };
            if !clear {
                continue;
            }
            match store.change_alarm(alarm, false).await {
                Ok(_) => tracing::info!(member = alarm.member, kind = ?alarm.kind, "cleared an alarm"),
                Err(e) => tracing::warn!(error = %e, "clearing an alarm failed; will retry"),
            }
        }
    }
}

/// How often the leader considers compacting under `--history-retention`.
const COMPACTION_CHECK: Duration = Duration::from_secs(5);

/// How often [`run_snapshot_trigger`] looks at the log.
const SNAPSHOT_CHECK: Duration = Duration::from_millis(250);

/// Builds a snapshot (after which openraft purges the log it covers) once
/// [`StoreConfig::snapshot_logs`] entries, or [`StoreConfig::snapshot_log_bytes`]
/// bytes of entries (or the database's size, if larger), were appended since
/// the last one. A snapshot copies the whole database, so an entry count
/// alone made small writes pay dearly: 20,000 one-write entries are 9 MB,
/// and with a 200 MB database every 9 MB written cost a 200 MB copy, which
/// doubled the 1-client p99 while it ran. Members snapshot at different
/// points (up to 7/16 later, by id): a snapshot's checkpoint flushes every
/// memtable, and all members flushing at once stalled everyone's log fsyncs.
async fn run_snapshot_trigger(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Bytes appended when the last snapshot was asked for (since this
    // process opened the log: a restart counts from zero, which only delays
    // the next snapshot by bytes; the entry count still applies).
    let mut bytes_base = 0;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let config = &inner.config;
        let stagger = |n: u64| n.saturating_add(n / 16 * (config.id % 8));
        let (applied, snapshot) = {
            let metrics = inner.raft.metrics();
            let m = metrics.borrow();
            (m.last_applied.map_or(0, |l| l.index), m.snapshot.map_or(0, |l| l.index))
        };
        if applied <= snapshot {
            continue;
        }
        let appended = inner.log.appended_bytes();
        let byte_limit = config.snapshot_log_bytes.max(inner.sm.db_size());
        let due = applied - snapshot >= stagger(config.snapshot_logs)
            || appended.saturating_sub(bytes_base) >= stagger(byte_limit);
        if !due {
            continue;
        }
        bytes_base = appended;
        tracing::debug!(applied, snapshot, "building a snapshot");
        if let Err(e) = inner.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "cannot trigger a snapshot");
            return;
        }
    }
}

/// While this member leads, compacts history beyond the retention: by
/// revision count, or to the revision that was current `retention` ago
/// (sampled every check, as etcd's periodic compactor does).
async fn run_compactor(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(COMPACTION_CHECK);
    let mut samples: std::collections::VecDeque<(Instant, i64)> = std::collections::VecDeque::new();
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let store = Store { inner };
        let retention = store.inner.config.history_retention;
        let current = store.inner.sm.revision();
        let now = Instant::now();
        let target = match retention {
            Retention::Unlimited => continue,
            Retention::Revisions(n) => current - n,
            Retention::Duration(d) => {
                samples.push_back((now, current));
                // The newest sample at least `d` old is the compaction point.
                let mut target = 0;
                while samples.front().is_some_and(|(t, _)| now.duration_since(*t) >= d) {
                    target = samples.pop_front().map_or(0, |(_, r)| r);
                }
                if target > 0 {
                    samples.push_front((now - d, target));
                }
                target
            }
        };
        if store.leader() != Some(store.id()) || target <= store.inner.sm.compacted() {
            continue;
        }
        match store.write(Command::Compact { revision: target }).await {
            Ok(_) => tracing::info!(revision = target, "compacted history under --history-retention"),
            Err(StoreError::Apply(_)) => {}
            Err(e) => tracing::warn!(error = %e, "automatic compaction failed; will retry"),
        }
    }
}

/// Counts leader changes, and re-triggers an election if this member stays
/// candidate for more than twice the maximum election timeout (openraft 0.9 draws the timeout once
/// per process, so two survivors can otherwise keep splitting the vote).
async fn run_election_watchdog(raft: Raft, election_max: Duration) {
    let mut metrics = raft.metrics();
    let mut candidate_since: Option<Instant> = None;
    let mut leader = None;
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(election_max / 2) => {}
        }
        let now_leader = metrics.borrow().current_leader;
        if now_leader.is_some() && now_leader != leader {
            crate::metrics::metrics().leader_changes.inc();
        }
        leader = now_leader.or(leader);
        let state = metrics.borrow().state;
        match (state, candidate_since) {
            (ServerState::Candidate, None) => candidate_since = Some(Instant::now()),
            (ServerState::Candidate, Some(since)) if since.elapsed() > election_max * 2 => {
                let jitter = Duration::from_millis(rand::random::<u64>() % (election_max.as_millis() as u64 + 1));
                tokio::time::sleep(jitter).await;
                if metrics.borrow().state == ServerState::Candidate {
                    tracing::info!("still candidate after {:?}: triggering a new election", since.elapsed());
                    let _ = raft.trigger().elect().await;
                }
                candidate_since = Some(Instant::now());
            }
            (ServerState::Candidate, Some(_)) => {}
            _ => candidate_since = None,
        }
    }
}

#[cfg(test)]
mod tests {
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
