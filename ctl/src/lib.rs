//! `skiffctl`: the user CLI. It speaks gRPC to any apiserver (the etcd
//! services and Skiff's `Control` service) and links no storage code.
//!
//! Servers come from `--server HOST:PORT,...`, else `SKIFF_SERVER`, else
//! `127.0.0.1:2379`; each command tries them in order until one answers.
//!
//! A crate of its own that depends on `proto`, `api` and `client` only, so
//! the binary people copy to their laptops carries no RocksDB.
//!
//! # Layout
//! - this module: the command line and the etcd-level commands (`member`,
//!   `status`, `kv`, `compact`).
//! - [`objects`]: the Kubernetes object commands (`get`, `apply`,
//!   `delete`, `watch`, `history`, `diff`).
//! - [`certs`]: the cluster's certificate authority and client and
//!   server certificates (no server needed).
//! - [`token`]: join tokens for nodes.

pub mod certs;
pub mod objects;
pub mod token;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use skiff_proto::control::control_client::ControlClient;
use skiff_proto::control::HistoryRequest;
use skiff_proto::etcdserverpb::cluster_client::ClusterClient;
use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use skiff_proto::etcdserverpb::watch_client::WatchClient;
use skiff_proto::etcdserverpb::{
    watch_request, CompactionRequest, DeleteRangeRequest, MemberAddRequest, MemberListRequest, MemberRemoveRequest,
    PutRequest, RangeRequest, StatusRequest, WatchCreateRequest, WatchRequest,
};
use skiff_proto::mvccpb;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(name = "skiffctl", version, about = "Skiff's command-line client")]
pub struct Cli {
    /// Apiservers to talk to, comma-separated HOST:PORT (client port).
    #[arg(long, global = true, env = "SKIFF_SERVER", default_value = "127.0.0.1:2379")]
    pub server: String,
    #[command(flatten)]
    pub tls: skiff_client::runtime::config::ClientTlsArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Leader, term, applied index and revision of every member.
    Status,
    /// Keys and values.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Discard history below a revision.
    Compact { revision: i64 },
    /// Show objects as a table, YAML or JSON (`get pods -n default -l app=web`).
    Get(crate::objects::GetArgs),
    /// Create or update objects from manifests (client-side apply).
    Apply(crate::objects::ApplyArgs),
    /// Delete objects by name or from manifests.
    Delete(crate::objects::DeleteArgs),
    /// Follow changes to objects, resuming across apiserver failures.
    Watch(crate::objects::WatchArgs),
    /// Every stored revision of one object (`history pod/web-1`).
    History(crate::objects::HistoryArgs),
    /// A unified diff of one object between two revisions.
    Diff(crate::objects::DiffArgs),
    /// The cluster's certificate authority and the certificates it issues.
    #[command(subcommand)]
    Certs(crate::certs::CertsCommand),
    /// Join tokens for nodes (`skiff node --token`): create, list, revoke.
    #[command(subcommand)]
    Token(crate::token::TokenCommand),
}

#[derive(Subcommand)]
pub enum MemberCommand {
    List,
    /// Register a member that will start with this peer address.
    Add {
        name: String,
        #[arg(long)]
        peer_url: String,
        #[arg(long)]
        learner: bool,
    },
    Remove {
        id: u64,
    },
}

#[derive(Args)]
pub struct KeyArgs {
    pub key: String,
    /// Treat KEY as a prefix.
    #[arg(long)]
    pub prefix: bool,
}

#[derive(Subcommand)]
pub enum KvCommand {
    Get {
        #[command(flatten)]
        key: KeyArgs,
        /// Read as of this revision.
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
    Put {
        key: String,
        value: String,
    },
    Del {
        #[command(flatten)]
        key: KeyArgs,
    },
    Watch {
        #[command(flatten)]
        key: KeyArgs,
        /// Start from this revision (replays history).
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
    /// Every stored revision of KEY with its commit time.
    History {
        key: String,
    },
}

/// Connects to the first server that answers (over TLS with `tls`).
async fn connect(servers: &str, tls: Option<&skiff_pki::Connector>) -> Result<Channel, String> {
    let mut last = String::from("no server given");
    for s in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", s.split_once("://").map_or(s, |(_, rest)| rest));
        let endpoint = Endpoint::from_shared(url).map_err(|e| format!("bad server address {s:?}: {e}"))?;
        let endpoint = endpoint.connect_timeout(Duration::from_secs(2)).timeout(Duration::from_secs(15));
        let connected = match tls {
            Some(tls) => endpoint.connect_with_connector(tls.clone()).await,
            None => endpoint.connect().await,
        };
        match connected {
            Ok(c) => return Ok(c),
            Err(e) => last = format!("{s}: {e}"),
        }
    }
    Err(format!("cannot reach any apiserver ({last})"))
}

fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn range_end(k: &KeyArgs) -> Vec<u8> {
    if k.prefix {
        prefix_end(k.key.as_bytes())
    } else {
        Vec::new()
    }
}

fn status_msg(s: tonic::Status) -> String {
    s.message().to_string()
}

fn format_time(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

fn print_event(e: &mvccpb::Event) {
    let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 { "DELETE" } else { "PUT" };
    if let Some(kv) = &e.kv {
        println!("{kind} {} rev={}", String::from_utf8_lossy(&kv.key), kv.mod_revision);
        if kind == "PUT" {
            println!("{}", String::from_utf8_lossy(&kv.value));
        }
    }
}

pub async fn run(cli: Cli) -> Result<(), String> {
    use crate::objects;
    let servers: Vec<&str> = cli.server.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let tls = match cli.tls.files() {
        Some(files) => {
            let config = skiff_pki::transport::client_config(&files).map_err(|e| format!("TLS: {e}"))?;
            Some(skiff_pki::Connector::new(std::sync::Arc::new(config)))
        }
        None => None,
    };
    // The object commands go through the resource API, which takes a
    // bearer token as well as a client certificate; the KV and member
    // commands below are for the cluster's admin certificate only.
    let objects_client = || {
        let config = skiff_client::ClientConfig {
            tls: cli.tls.files(),
            token: cli.tls.token(),
            ..skiff_client::ClientConfig::new(&servers)
        };
        skiff_client::Client::from_config(&config).map_err(|e| e.to_string())
    };
    match cli.command {
        Command::Certs(c) => return certs::run(c),
        Command::Get(a) => return objects::get(&objects_client()?, a).await,
        Command::Apply(a) => return objects::apply(&objects_client()?, a).await,
        Command::Delete(a) => return objects::delete(&objects_client()?, a).await,
        Command::Watch(a) => return objects::watch(&objects_client()?, a).await,
        Command::History(a) => return objects::history_cmd(&objects_client()?, a).await,
        Command::Diff(a) => return objects::diff(&objects_client()?, a).await,
        Command::Token(t) => return token::run(&objects_client()?, cli.tls.certificate_authority.as_deref(), t).await,
        _ => {}
    }
    let channel = connect(&cli.server, tls.as_ref()).await?;
    match cli.command {
        Command::Member(m) => member(channel, m).await,
        Command::Status => status(channel, tls.as_ref()).await,
        Command::Kv(k) => kv(channel, k).await,
        Command::Compact { revision } => {
            let r = KvClient::new(channel)
                .compact(CompactionRequest { revision, physical: true })
                .await
                .map_err(status_msg)?;
            let _ = r;
            println!("compacted revision {revision}");
            Ok(())
        }
        Command::Get(_)
        | Command::Apply(_)
        | Command::Delete(_)
        | Command::Watch(_)
        | Command::History(_)
        | Command::Diff(_)
        | Command::Token(_)
        | Command::Certs(_) => unreachable!("handled above"),
    }
}

async fn member(channel: Channel, cmd: MemberCommand) -> Result<(), String> {
    let mut client = ClusterClient::new(channel);
    match cmd {
        MemberCommand::List => {
            let r =
                client.member_list(MemberListRequest { linearizable: true }).await.map_err(status_msg)?.into_inner();
            println!("{:<6} {:<12} {:<8} {:<28} CLIENT URLS", "ID", "NAME", "LEARNER", "PEER URLS");
            for m in r.members {
                println!(
                    "{:<6} {:<12} {:<8} {:<28} {}",
                    m.id,
                    m.name,
                    m.is_learner,
                    m.peer_ur_ls.join(","),
                    m.client_ur_ls.join(",")
                );
            }
            Ok(())
        }
        MemberCommand::Add { name, peer_url, learner } => {
            let r = client
                .member_add(MemberAddRequest { peer_ur_ls: vec![peer_url], is_learner: learner })
                .await
                .map_err(status_msg)?
                .into_inner();
            let id = r.member.map_or(0, |m| m.id);
            println!("member {name} added with id {id}; start it with --id {id} --join <any member's client address>");
            Ok(())
        }
        MemberCommand::Remove { id } => {
            client.member_remove(MemberRemoveRequest { id }).await.map_err(status_msg)?;
            println!("member {id} removed");
            Ok(())
        }
    }
}

async fn status(channel: Channel, tls: Option<&skiff_pki::Connector>) -> Result<(), String> {
    let members = ClusterClient::new(channel)
        .member_list(MemberListRequest { linearizable: false })
        .await
        .map_err(status_msg)?
        .into_inner()
        .members;
    println!(
        "{:<6} {:<12} {:<24} {:<7} {:<6} {:<10} {:<9}",
        "ID", "NAME", "ENDPOINT", "LEADER", "TERM", "APPLIED", "REVISION"
    );
    for m in members {
        let endpoint = m.client_ur_ls.first().cloned().unwrap_or_default();
        if endpoint.is_empty() {
            // A member publishes its client URLs through the log once it runs.
            println!("{:<6} {:<12} {:<24} not started yet (no client URL published)", m.id, m.name, "-");
            continue;
        }
        let row = match connect(&endpoint, tls).await {
            Ok(c) => match MaintenanceClient::new(c).status(StatusRequest {}).await {
                Ok(s) => {
                    let s = s.into_inner();
                    let revision = s.header.as_ref().map_or(0, |h| h.revision);
                    format!(
                        "{:<7} {:<6} {:<10} {:<9}",
                        if s.leader == m.id { "*" } else { "" },
                        s.raft_term,
                        s.raft_applied_index,
                        revision
                    )
                }
                Err(e) => format!("unavailable: {}", e.message()),
            },
            Err(e) => format!("unreachable: {e}"),
        };
        println!("{:<6} {:<12} {:<24} {row}", m.id, m.name, endpoint.trim_start_matches("http://"));
    }
    Ok(())
}

async fn kv(channel: Channel, cmd: KvCommand) -> Result<(), String> {
    match cmd {
        KvCommand::Get { key, rev } => {
            let r = KvClient::new(channel)
                .range(RangeRequest {
                    key: key.key.clone().into_bytes(),
                    range_end: range_end(&key),
                    revision: rev,
                    ..Default::default()
                })
                .await
                .map_err(status_msg)?
                .into_inner();
            for kv in r.kvs {
                println!("{}\n{}", String::from_utf8_lossy(&kv.key), String::from_utf8_lossy(&kv.value));
            }
            Ok(())
        }
        KvCommand::Put { key, value } => {
            let r = KvClient::new(channel)
                .put(PutRequest { key: key.into_bytes(), value: value.into_bytes(), ..Default::default() })
                .await
                .map_err(status_msg)?
                .into_inner();
            println!("OK (revision {})", r.header.map_or(0, |h| h.revision));
            Ok(())
        }
        KvCommand::Del { key } => {
            let r = KvClient::new(channel)
                .delete_range(DeleteRangeRequest {
                    key: key.key.clone().into_bytes(),
                    range_end: range_end(&key),
                    ..Default::default()
                })
                .await
                .map_err(status_msg)?
                .into_inner();
            println!("{}", r.deleted);
            Ok(())
        }
        KvCommand::Watch { key, rev } => {
            let create = WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
                    key: key.key.clone().into_bytes(),
                    range_end: range_end(&key),
                    start_revision: rev,
                    ..Default::default()
                })),
            };
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(create).await.map_err(|e| e.to_string())?;
            let mut stream = WatchClient::new(channel)
                .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(status_msg)?
                .into_inner();
            while let Some(resp) = stream.message().await.map_err(status_msg)? {
                if resp.canceled {
                    return Err(format!("watch canceled: {}", resp.cancel_reason));
                }
                for e in &resp.events {
                    print_event(e);
                }
            }
            drop(tx);
            Ok(())
        }
        KvCommand::History { key } => {
            let r = ControlClient::new(channel)
                .history(HistoryRequest { key: key.clone().into_bytes(), serializable: false })
                .await
                .map_err(status_msg)?
                .into_inner();
            println!("{:<10} {:<7} {:<25} {:<8} VALUE", "REVISION", "EVENT", "COMMIT TIME", "VERSION");
            for e in r.entries {
                let kv = e.kv.unwrap_or_default();
                let deleted = e.r#type == mvccpb::event::EventType::Delete as i32;
                println!(
                    "{:<10} {:<7} {:<25} {:<8} {}",
                    e.revision,
                    if deleted { "DELETE" } else { "PUT" },
                    format_time(e.commit_time_ms),
                    kv.version,
                    String::from_utf8_lossy(&kv.value)
                );
            }
            if r.compact_revision > 0 {
                println!("(history before revision {} was compacted)", r.compact_revision);
            }
            Ok(())
        }
    }
}
