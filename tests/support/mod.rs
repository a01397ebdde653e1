//! Real-process cluster harness: `skiff apiserver` members on loopback,
//! started, killed with SIGKILL, restarted and wiped by the tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use skiff_proto::etcdserverpb::{RangeRequest, StatusRequest};
use tonic::transport::{Channel, Endpoint};

pub mod controllers;
pub mod kubectl;
pub mod netns;
pub mod node;
pub mod pki;

pub const SKIFF: &str = env!("CARGO_BIN_EXE_skiff");

/// `skiffctl`, built beside `skiff` by `cargo build --workspace --bins`
/// (it is a package of its own, so cargo names no `CARGO_BIN_EXE_` for it
/// here; `make test` builds every binary first).
pub fn skiffctl_path() -> PathBuf {
    let path = std::path::Path::new(SKIFF).with_file_name("skiffctl");
    assert!(path.exists(), "{} is missing: run `cargo build --release --workspace --bins` first", path.display());
    path
}

pub use skiff_testing::free_port;

pub struct Member {
    pub id: u64,
    pub client: String,
    pub peer: String,
    pub http: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// The network namespace the member runs in, if not the test's own.
    pub netns: Option<String>,
}

impl Member {
    fn new(root: &std::path::Path, id: u64) -> Member {
        Member {
            id,
            client: format!("127.0.0.1:{}", free_port()),
            peer: format!("127.0.0.1:{}", free_port()),
            http: format!("127.0.0.1:{}", free_port()),
            data_dir: root.join(format!("member-{id}")),
            log: root.join(format!("member-{id}.log")),
            child: None,
            netns: None,
        }
    }

    /// A member in network namespace `ns` at `addr`, on the standard ports.
    fn in_netns(root: &std::path::Path, id: u64, ns: &str, addr: &str) -> Member {
        Member {
            id,
            client: format!("{addr}:2379"),
            peer: format!("{addr}:2380"),
            http: format!("{addr}:6443"),
            data_dir: root.join(format!("member-{id}")),
            log: root.join(format!("member-{id}.log")),
            child: None,
            netns: Some(ns.to_string()),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = match &self.netns {
            // `ip netns exec` execs the member in place: its pid is the member's.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, SKIFF]);
                c
            }
            None => Command::new(SKIFF),
        };
        cmd.arg("apiserver")
            .args(["--id", &self.id.to_string()])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--client-listen", &self.client, "--peer-listen", &self.peer, "--http-listen", &self.http])
            .args(["--watch-progress-interval", "1s"]);
        cmd
    }
}

pub struct Cluster {
    pub root: tempfile::TempDir,
    pub members: BTreeMap<u64, Member>,
    pub initial: String,
    /// Flags every member of this cluster is started with.
    pub extra_args: Vec<String>,
    /// How the harness reaches the members' client ports: plaintext, or
    /// TLS with this connector (the cluster's CA and an admin certificate).
    pub client_tls: Option<skiff_pki::Connector>,
    /// The certificates of a cluster the harness secured itself
    /// ([`Cluster::spawn`]): etcdctl, curl and kubectl present them too.
    pub pki: Option<pki::Pki>,
}

impl Cluster {
    /// Starts `n` founding members as `skiff up` runs them and waits for
    /// a leader: TLS on every listener, mutual TLS between peers,
    /// certificates checked on the client port, RBAC on the REST API. The
    /// harness, etcdctl, curl and kubectl ([`Cluster::api`]) present an
    /// administrator's certificate.
    pub async fn spawn(n: u64) -> Cluster {
        Self::spawn_with(n, &[]).await
    }

    /// [`Cluster::spawn`], each member with `extra_args` too.
    pub async fn spawn_with(n: u64, extra_args: &[&str]) -> Cluster {
        let pki = pki::Pki::create(&["127.0.0.1".to_string()]);
        Self::spawn_secured(pki, n, extra_args, Member::new).await
    }

    /// Starts `n` founding members with `extra_args` only: the harness
    /// secures nothing and reaches the client ports in plaintext. For tests
    /// of a cluster without certificates (etcd's own users and roles) and
    /// tests that bring their own certificates for the HTTP port.
    pub async fn spawn_plain(n: u64, extra_args: &[&str]) -> Cluster {
        Self::spawn_members(n, extra_args, None, Member::new).await
    }

    /// [`Cluster::spawn_with`] for members the test secures itself: the
    /// harness reaches their client ports with `client_tls`.
    pub async fn spawn_tls(n: u64, extra_args: &[&str], client_tls: skiff_pki::Connector) -> Cluster {
        Self::spawn_members(n, extra_args, Some(client_tls), Member::new).await
    }

    /// [`Cluster::spawn_with`] with each member in its own network
    /// namespace of `net` (which must have namespaces for ids 1..=n).
    pub async fn spawn_in(net: &netns::Network, n: u64, extra_args: &[&str]) -> Cluster {
        let pki = pki::Pki::create(&net.member_addresses());
        let member = |root: &std::path::Path, id| Member::in_netns(root, id, net.namespace(id), net.address(id));
        Self::spawn_secured(pki, n, extra_args, member).await
    }

    async fn spawn_secured(
        pki: pki::Pki,
        n: u64,
        extra_args: &[&str],
        member: impl Fn(&std::path::Path, u64) -> Member,
    ) -> Cluster {
        let flags = pki.member_flags();
        let args: Vec<&str> = flags.iter().map(String::as_str).chain(extra_args.iter().copied()).collect();
        let admin = pki.admin();
        let mut cluster = Self::spawn_members(n, &args, Some(admin), member).await;
        cluster.pki = Some(pki);
        cluster
    }

    /// Starts founding members 1..=n made by `member` (from the cluster's
    /// directory and the id), each with `extra_args`, and waits for a leader.
    async fn spawn_members(
        n: u64,
        extra_args: &[&str],
        client_tls: Option<skiff_pki::Connector>,
        member: impl Fn(&std::path::Path, u64) -> Member,
    ) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let members: BTreeMap<u64, Member> = (1..=n).map(|id| (id, member(root.path(), id))).collect();
        let initial = members.values().map(|m| format!("{}={}", m.id, m.peer)).collect::<Vec<_>>().join(",");
        let extra_args = extra_args.iter().map(|s| s.to_string()).collect();
        let mut cluster = Cluster { root, members, initial, extra_args, client_tls, pki: None };
        for id in 1..=n {
            cluster.start(id);
        }
        cluster.must_leader().await;
        cluster.must_have_defaults().await;
        cluster
    }

    /// Waits until every running member has the default objects the
    /// masters create at start (namespaces, priority classes, RBAC's
    /// defaults): tests that begin sooner race them (`namespaces
    /// "kube-system" not found`). Members serving plain HTTP are asked
    /// `/readyz`, which waits for them (and needs no credentials, even with
    /// etcd auth on); members serving HTTPS are read through the KV API.
    pub async fn must_have_defaults(&self) {
        let key = skiff_testing::cluster::LAST_DEFAULT_OBJECT.as_bytes().to_vec();
        let https = self.extra_args.iter().any(|a| a == "--tls-cert-file");
        for m in self.running() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let ready = async {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut stream = tokio::net::TcpStream::connect(&m.http).await.map_err(|e| e.to_string())?;
                    stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await.map_err(|e| e.to_string())?;
                    let mut response = Vec::new();
                    stream.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
                    let response = String::from_utf8_lossy(&response).into_owned();
                    let status = response.lines().next().unwrap_or_default().to_string();
                    Ok::<bool, String>(status.split_whitespace().nth(1) == Some("200"))
                };
                let found = async {
                    let mut kv = KvClient::new(connect(&m.client, self.client_tls.as_ref()).await?);
                    let mut req = tonic::Request::new(RangeRequest {
                        key: key.clone(),
                        serializable: true,
                        ..Default::default()
                    });
                    req.set_timeout(Duration::from_secs(2));
                    kv.range(req).await.map(|r| !r.into_inner().kvs.is_empty()).map_err(|e| e.to_string())
                };
                let seen = if https {
                    found.await
                } else {
                    tokio::time::timeout(Duration::from_secs(2), ready)
                        .await
                        .unwrap_or_else(|_| Err("/readyz timed out".to_string()))
                };
                if seen == Ok(true) {
                    break;
                }
                if Instant::now() > deadline {
                    panic!("member {} has no default objects after 60s ({seen:?}):\n{}", m.id, self.log_of(m.id));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to member `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        if let Some(c) = &self.members[&id].child {
            let _ = Command::new("kill").args([&format!("-{signal}"), &c.id().to_string()]).status();
        }
    }

    /// Waits for member `id` to exit after a SIGTERM (killing it after 10 s).
    pub fn stop(&mut self, id: u64) {
        self.signal(id, "TERM");
        if let Some(mut c) = self.members.get_mut(&id).unwrap().child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }

    /// Starts (or restarts) member `id` as a founding member.
    pub fn start(&mut self, id: u64) {
        let initial = self.initial.clone();
        self.start_with(id, &["--initial-cluster", &initial]);
    }

    pub fn start_with(&mut self, id: u64, args: &[&str]) {
        let extra = self.extra_args.clone();
        self.spawn_member(id, args, &extra);
    }

    /// Starts member `id` with `args` only, not the flags the cluster's
    /// other members share (a master that joins with a token).
    pub fn start_alone(&mut self, id: u64, args: &[&str]) {
        self.spawn_member(id, args, &[]);
    }

    fn spawn_member(&mut self, id: u64, args: &[&str], extra: &[String]) {
        let m = self.members.get_mut(&id).unwrap();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log).unwrap();
        let child = m
            .command()
            .args(args)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        m.child = Some(child);
    }

    /// Runs member `id`'s command to completion (for start-up failures).
    pub fn run_to_exit(&mut self, id: u64, args: &[&str]) -> Output {
        let m = self.members.get_mut(&id).unwrap();
        let mut cmd = m.command();
        cmd.args(args);
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if child.try_wait().unwrap().is_some() {
                return child.wait_with_output().unwrap();
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("member {id} did not exit: {:?}", child.wait_with_output().unwrap());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A new (not yet started) member.
    /// A member that will join later, in network namespace `ns` at `addr`.
    pub fn add_member_in(&mut self, id: u64, ns: &str, addr: &str) -> &Member {
        let m = Member::in_netns(self.root.path(), id, ns, addr);
        self.members.insert(id, m);
        &self.members[&id]
    }

    pub fn add_member(&mut self, id: u64) -> &Member {
        let m = Member::new(self.root.path(), id);
        self.members.insert(id, m);
        &self.members[&id]
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.members.get_mut(&id).unwrap().child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn wipe(&mut self, id: u64) {
        let m = &self.members[&id];
        let _ = std::fs::remove_dir_all(&m.data_dir);
    }

    pub fn endpoints(&self) -> String {
        self.running().map(|m| m.client.clone()).collect::<Vec<_>>().join(",")
    }

    pub fn running(&self) -> impl Iterator<Item = &Member> {
        self.members.values().filter(|m| m.child.is_some())
    }

    /// Member `id`'s REST API, as the administrator on a secured cluster.
    pub fn api(&self, id: u64) -> kubectl::Api {
        let http = &self.members[&id].http;
        match &self.pki {
            Some(pki) => pki.api(http),
            None => kubectl::Api::plain(http),
        }
    }

    /// The flags a component (`skiff controller-manager`, `scheduler`,
    /// `node`) reaches this cluster with: on a secured cluster, a client
    /// certificate for `user` in `groups` (issued as `STEM.crt`) and the CA.
    /// Each process needs a stem of its own: issuing rewrites the files,
    /// and a process reading them meanwhile could pair one certificate
    /// with another's key.
    pub fn component_flags(&self, stem: &str, user: &str, groups: &[&str]) -> Vec<String> {
        let Some(pki) = &self.pki else { return Vec::new() };
        pki.issue_client(stem, user, groups);
        pki.component_flags(stem)
    }

    /// A gauge from member `id`'s `/metrics` (None if it does not answer).
    pub fn gauge(&self, id: u64, name: &str) -> Option<i64> {
        let api = self.api(id);
        let url = format!("{}/metrics", api.url());
        let out = Command::new("curl").args(["-s", "--max-time", "2", &url]).args(api.curl_flags()).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok()).map(|v| v as i64)
    }

    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(&self.members[&id].log).unwrap_or_default()
    }

    /// Whether member `id` (since it last started) installed a snapshot
    /// the leader sent. Its snapshot directory does not tell: a member
    /// that caught up by a snapshot may build its own at once, and until
    /// that one is packed the directory holds no `.snap` file.
    pub fn installed_snapshot(&self, id: u64) -> bool {
        self.gauge(id, "skiff_raft_snapshots_installed_total").unwrap_or(0) > 0
    }

    /// Whether member `id` holds a packed snapshot (`snapshots/*.snap`).
    pub fn has_snapshot(&self, id: u64) -> bool {
        std::fs::read_dir(self.members[&id].data_dir.join("snapshots"))
            .map(|d| d.flatten().any(|e| e.path().extension().is_some_and(|x| x == "snap")))
            .unwrap_or(false)
    }

    /// Waits until `leader` has purged its log past `index`. A snapshot on
    /// disk is not enough: the leader purges its log after building one,
    /// and only once the entries a member lacks are gone must that member
    /// catch up from a snapshot rather than from the entries.
    pub async fn must_purge_past(&self, leader: u64, index: i64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.gauge(leader, "skiff_raft_purged_index").unwrap_or(0) <= index {
            assert!(
                Instant::now() < deadline,
                "the leader kept entries {index}.. in its log:\n{}",
                self.log_of(leader)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The leader as the running members agree on it (and itself running).
    pub async fn must_leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut seen = Vec::new();
            for m in self.running() {
                if let Ok(s) = status_over(&m.client, self.client_tls.as_ref()).await {
                    seen.push(s.leader);
                }
            }
            let n = self.running().count();
            let alive = self.running().any(|m| m.id == seen.first().copied().unwrap_or(0));
            if seen.len() == n && n > 0 && alive && seen.iter().all(|l| *l == seen[0]) {
                return seen[0];
            }
            if Instant::now() > deadline {
                let logs: Vec<String> =
                    self.running().map(|m| format!("--- member {} ---\n{}", m.id, self.log_of(m.id))).collect();
                panic!("no agreed leader within 30s: {seen:?}\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until member `id` has applied `revision` (its own, local view).
    pub async fn must_catch_up(&self, id: u64, revision: i64, within: Duration) {
        let addr = &self.members[&id].client;
        let deadline = Instant::now() + within;
        loop {
            let seen =
                status_over(addr, self.client_tls.as_ref()).await.map(|s| s.header.unwrap().revision).unwrap_or(0);
            if seen >= revision {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "member {id} stuck at revision {seen} < {revision}:\n{}",
                self.log_of(id)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs the real etcdctl against `endpoints` with `args` (as the
    /// administrator, over TLS, in a cluster the harness secured).
    pub fn etcdctl(&self, endpoints: &str, args: &[&str]) -> Output {
        self.etcdctl_stdin(endpoints, args, None)
    }

    /// [`Cluster::etcdctl`] with `stdin` as its input.
    pub fn etcdctl_stdin(&self, endpoints: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let args = self.etcdctl_args(args);
        etcdctl(endpoints, &args.iter().map(String::as_str).collect::<Vec<_>>(), stdin)
    }

    /// A long-running etcdctl (`watch`, `lock`, `elect`) with its output
    /// piped, started as [`Cluster::etcdctl`] runs one.
    pub fn etcdctl_child(&self, endpoints: &str, args: &[&str]) -> Child {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(self.etcdctl_args(args))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl is installed (make deps)")
    }

    /// `args` after the TLS flags of a cluster the harness secured.
    fn etcdctl_args(&self, args: &[&str]) -> Vec<String> {
        let tls = self.pki.as_ref().map(pki::Pki::etcdctl_flags).unwrap_or_default();
        tls.into_iter().chain(args.iter().map(|a| a.to_string())).collect()
    }

    /// Runs `skiffctl --server SERVERS ARGS` (as the administrator, over
    /// TLS, in a cluster the harness secured).
    pub fn skiffctl(&self, servers: &str, args: &[&str]) -> Output {
        let tls = self.pki.as_ref().map(|pki| pki.component_flags(pki::ADMIN)).unwrap_or_default();
        Command::new(skiffctl_path()).args(["--server", servers]).args(tls).args(args).output().unwrap()
    }

    /// A channel to the client port at `addr`, as the harness reaches this
    /// cluster's members (over TLS as the administrator, if secured).
    pub async fn channel(&self, addr: &str) -> Result<Channel, String> {
        connect(addr, self.client_tls.as_ref()).await
    }

    /// A KV client of the member at `addr` (see [`Cluster::channel`]).
    pub async fn kv(&self, addr: &str) -> KvClient<Channel> {
        KvClient::new(self.channel(addr).await.unwrap())
    }

    /// The etcd status of the member at `addr`.
    pub async fn status(&self, addr: &str) -> Result<skiff_proto::etcdserverpb::StatusResponse, String> {
        status_over(addr, self.client_tls.as_ref()).await
    }

    /// A resource API client of every running member, as the harness
    /// reaches them.
    pub fn client(&self) -> skiff_client::Client {
        let endpoints: Vec<String> = self.running().map(|m| m.client.clone()).collect();
        self.resource_client(&endpoints)
    }

    /// A resource API client of `endpoints`, as the harness reaches them.
    pub fn resource_client<S: AsRef<str>>(&self, endpoints: &[S]) -> skiff_client::Client {
        skiff_client::Client::connect(endpoints, None, self.client_tls.clone()).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in self.members.values_mut() {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

pub fn etcdctl(endpoints: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--command-timeout=15s")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("etcdctl is installed (make deps)");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[track_caller]
pub fn must_succeed(o: Output) -> String {
    assert!(
        o.status.success(),
        "command failed: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

pub async fn channel(addr: &str) -> Result<Channel, tonic::transport::Error> {
    endpoint(addr, None).connect().await
}

/// The settings of the harness's channels to a member's client port.
pub fn endpoint(addr: &str, tls: Option<&skiff_pki::Connector>) -> Endpoint {
    let scheme = if tls.is_some() { "https" } else { "http" };
    Endpoint::from_shared(format!("{scheme}://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(15))
}

pub async fn status(addr: &str) -> Result<skiff_proto::etcdserverpb::StatusResponse, String> {
    status_over(addr, None).await
}

/// [`status`] over TLS with `tls`, if given.
pub async fn status_over(
    addr: &str,
    tls: Option<&skiff_pki::Connector>,
) -> Result<skiff_proto::etcdserverpb::StatusResponse, String> {
    let mut c = MaintenanceClient::new(connect(addr, tls).await?);
    let mut req = tonic::Request::new(StatusRequest {});
    req.set_timeout(Duration::from_secs(2));
    c.status(req).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
}

/// A channel to a member's client port, over TLS with `tls` if given.
pub async fn connect(addr: &str, tls: Option<&skiff_pki::Connector>) -> Result<Channel, String> {
    let endpoint = endpoint(addr, tls);
    match tls {
        Some(tls) => endpoint.connect_with_connector(tls.clone()).await,
        None => endpoint.connect().await,
    }
    .map_err(|e| e.to_string())
}

pub async fn kv(addr: &str) -> KvClient<Channel> {
    KvClient::new(channel(addr).await.unwrap())
}
