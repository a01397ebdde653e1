//! What a member is started with: [`StoreConfig`], and [`Retention`], the
//! automatic compaction policy parsed from `--history-retention`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::network::PeerFilter;
use crate::types::NodeId;

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
    /// Which outgoing peer calls are let through: all, unless a test
    /// partitions members of one process (skiff-testing's cluster).
    pub peer_filter: PeerFilter,
    /// How long an auth token issued by this member lives unused (etcd's
    /// `--auth-token-ttl`).
    pub auth_token_ttl: Duration,
    /// TLS to the other members' peer listeners, presenting this member's
    /// peer certificate and accepting only theirs; `None`: plaintext.
    pub peer_tls: Option<skiff_pki::Connector>,
    /// TLS to the client listener of the member `join` names, presenting
    /// this member's peer certificate; `None`: plaintext.
    pub join_tls: Option<skiff_pki::Connector>,
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
            peer_filter: PeerFilter::default(),
            // etcd's default `--auth-token-ttl`.
            auth_token_ttl: Duration::from_secs(300),
            peer_tls: None,
            join_tls: None,
        }
    }
}
