//! [`InProcessCluster`]: n apiserver members in the test's own process.
//!
//! Each member listens on loopback ports of its own ([`free_port`]) and
//! keeps its data dir in the cluster's temporary directory, so a member that
//! was stopped or killed restarts on the same data and the same addresses.
//! All members share one [`PeerFilter`]: a partition blocks the peer calls
//! between two groups of members in both directions, and openraft sees those
//! calls fail as an unreachable peer, as in a real partition. Client calls
//! (gRPC, HTTP) are never filtered: a test reaches every running member.
//!
//! The members run as `skiff up` runs masters: one CA per cluster, TLS on
//! the client and HTTP listeners with client certificates checked, mutual
//! TLS between peers, RBAC on. Tests reach them as the cluster's
//! administrator (`system:masters`) through [`InProcessCluster::connector`],
//! [`InProcessCluster::channel`] and [`InProcessCluster::http_get`].
//!
//! Members still running when the cluster is dropped are not stopped
//! cleanly; their tasks end with the test's runtime. [`InProcessCluster::shutdown`]
//! stops them and checks that each one stopped cleanly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use skiff_apiserver::admission::Security;
use skiff_apiserver::config::{Authentication, Authorization};
use skiff_apiserver::{ApiserverConfig, Listeners, RunError, Running};
use skiff_pki::{ClientFiles, Profile, ServerFiles, DEFAULT_VALIDITY, MASTERS_GROUP};
use skiff_raft_store::network::PeerFilter;
use skiff_raft_store::store::StartError;
use skiff_raft_store::types::{NodeId, RangeRequest};
use skiff_raft_store::{Store, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

use crate::port::free_port;

/// The default object every master creates last at start.
pub const LAST_DEFAULT_OBJECT: &str = "/registry/clusterrolebindings/system:monitoring";
use crate::wait::must_eventually;

/// How long members may take to agree on a leader. Generous: elections
/// take about a second, but the machines tests run on are slow and shared.
const LEADER_WITHIN: Duration = Duration::from_secs(60);

/// How long a member may take to start, while the ports or the RocksDB
/// files of its previous run in this process are being released.
const START_WITHIN: Duration = Duration::from_secs(30);

/// A TLS connection to a member's HTTP listener.
pub type HttpsStream = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// n apiserver members (ids 1..=n) in this process. See the module docs.
pub struct InProcessCluster {
    /// Every member's data dir and the certificates, removed with the cluster.
    _dir: tempfile::TempDir,
    /// The CA and the certificates (`ca.crt`, `apiserver`, `peer`, `admin`).
    pki: PathBuf,
    security: Security,
    members: BTreeMap<NodeId, Member>,
    /// Shared by every member's peer transport.
    filter: PeerFilter,
    /// The (from, to) pairs blocked by the partitions in place.
    partitions: BTreeSet<(NodeId, NodeId)>,
    /// Members killed and not restarted since: cut off from every peer.
    killed: BTreeSet<NodeId>,
    /// Each member's client (etcd and resource gRPC) address; member `id`
    /// is at `clients[id - 1]`.
    pub clients: Vec<String>,
    /// Each member's HTTP address (Kubernetes REST, health, metrics);
    /// member `id` is at `https[id - 1]`.
    pub https: Vec<String>,
}

struct Member {
    /// The configuration every run of this member starts with: the same
    /// addresses and data dir.
    config: ApiserverConfig,
    /// `None` while the member is stopped or killed.
    running: Option<Running>,
}

impl InProcessCluster {
    /// Starts `n` founding members and waits until they agree on a leader.
    /// They authenticate by client certificate and authorize with RBAC
    /// (behind the Node authorizer), as `skiff apiserver` does with
    /// `--client-ca-file`.
    pub async fn spawn(n: u64) -> Self {
        Self::spawn_configured(n, |_| {}).await
    }

    /// A cluster whose members run `security`'s layers (authenticators,
    /// authorizer, admission plugins) instead of the certificates and
    /// RBAC: the listeners still serve TLS and check certificates.
    pub async fn spawn_with(n: u64, security: Security) -> Self {
        Self::start_cluster(n, Some(security), |_| {}).await
    }

    /// A cluster whose members' store settings `tweak` adjusts.
    pub async fn spawn_configured(n: u64, tweak: impl Fn(&mut StoreConfig)) -> Self {
        Self::start_cluster(n, None, tweak).await
    }

    /// Starts the members with `security`'s layers, or certificates and
    /// RBAC without them.
    async fn start_cluster(n: u64, security: Option<Security>, tweak: impl Fn(&mut StoreConfig)) -> Self {
        let authentication = Authentication { client_certificates: true, token_auth_file: None };
        let (security, authorization) = match security {
            Some(security) => (security, Authorization::AlwaysAllow),
            None => (
                Security::for_config(&authentication).expect("certificate authentication needs no files"),
                Authorization::Rbac,
            ),
        };
        let dir = tempfile::tempdir().expect("a temporary directory for the data dirs");
        let pki = dir.path().join("pki");
        issue_certificates(&pki);
        let files = |stem: &str| ServerFiles {
            cert: pki.join(format!("{stem}.crt")),
            key: pki.join(format!("{stem}.key")),
            client_ca: Some(pki.join("ca.crt")),
        };
        let filter = PeerFilter::default();
        let address = || format!("127.0.0.1:{}", free_port());
        let addresses: BTreeMap<NodeId, [String; 3]> =
            (1..=n).map(|id| (id, [address(), address(), address()])).collect();
        let initial: BTreeMap<NodeId, String> = addresses.iter().map(|(id, [peer, ..])| (*id, peer.clone())).collect();
        let mut members = BTreeMap::new();
        for (id, [peer, client, http]) in &addresses {
            let mut store = StoreConfig::new(*id, dir.path().join(format!("m{id}")), peer.clone());
            store.initial_cluster = initial.clone();
            store.client_urls = vec![format!("https://{client}")];
            tweak(&mut store);
            store.peer_filter = filter.clone();
            let config = ApiserverConfig {
                store,
                peer_listen: peer.clone(),
                client_listen: client.clone(),
                http_listen: http.clone(),
                http_tls: Some(files("apiserver")),
                client_tls: Some(files("apiserver")),
                peer_tls: Some(files("peer")),
                authentication: authentication.clone(),
                authorization,
                audit: None,
                fairness: None,
                encryption_provider_config: None,
                cluster_signing: None,
                service_account: None,
                watch_progress_interval: Duration::from_millis(300),
                watch_bookmark_interval: Duration::from_millis(300),
            };
            members.insert(*id, Member { config, running: None });
        }
        // Members must start concurrently: each one's bootstrap probes the others.
        let starts = members.values().map(|m| start(&m.config, &security));
        let started = futures::future::join_all(starts).await;
        for (member, running) in members.values_mut().zip(started) {
            member.running = Some(running);
        }
        let cluster = InProcessCluster {
            _dir: dir,
            pki,
            security,
            members,
            filter,
            partitions: BTreeSet::new(),
            killed: BTreeSet::new(),
            clients: addresses.values().map(|[_, client, _]| client.clone()).collect(),
            https: addresses.values().map(|[.., http]| http.clone()).collect(),
        };
        cluster.must_leader().await;
        // Every master writes the default objects at start (namespaces,
        // priority classes, RBAC's roles and bindings, this binding last):
        // tests begin once they are in, on a store nothing else writes to.
        for store in cluster.stores() {
            must_eventually("the default objects are created", Duration::from_secs(60), || async {
                let req = RangeRequest { key: LAST_DEFAULT_OBJECT.as_bytes().to_vec(), ..Default::default() };
                match store.range(req, true).await {
                    Ok((r, _)) if !r.kvs.is_empty() => Ok(()),
                    Ok(_) => Err("not yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;
        }
        cluster
    }

    /// Every member's id, running or not.
    pub fn ids(&self) -> Vec<NodeId> {
        self.members.keys().copied().collect()
    }

    /// The ids of the members running now.
    pub fn running_ids(&self) -> Vec<NodeId> {
        self.members.iter().filter(|(_, m)| m.running.is_some()).map(|(id, _)| *id).collect()
    }

    /// Member `id`'s store; panics if the member is not running.
    pub fn store(&self, id: NodeId) -> &Store {
        &self.running(id).store
    }

    /// The stores of the running members.
    pub fn stores(&self) -> impl Iterator<Item = &Store> {
        self.members.values().filter_map(|m| m.running.as_ref()).map(|r| &r.store)
    }

    /// Member `id`'s client address.
    pub fn client(&self, id: NodeId) -> &str {
        &self.clients[self.index(id)]
    }

    /// A connector for the members' client ports: it trusts the cluster's
    /// CA and presents the administrator's certificate.
    pub fn connector(&self) -> skiff_pki::Connector {
        skiff_pki::Connector::new(Arc::new(
            skiff_pki::transport::client_config(&self.admin_files()).expect("the administrator's TLS configuration"),
        ))
    }

    /// The settings of a channel to the client port at `addr`, to connect
    /// with [`InProcessCluster::connector`].
    pub fn endpoint(&self, addr: &str) -> Endpoint {
        Endpoint::from_shared(format!("https://{addr}")).expect("a member's address")
    }

    /// A channel to the client port at `addr`, as the administrator.
    pub async fn channel(&self, addr: &str) -> Channel {
        let endpoint = self.endpoint(addr);
        endpoint.connect_with_connector(self.connector()).await.unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
    }

    /// Sends `GET path` (HTTP/1.0, over TLS as the administrator) to the
    /// HTTP listener at `http` and reads the response head; the stream is
    /// left open at the body.
    pub async fn http_open(&self, http: &str, path: &str) -> (HttpsStream, String) {
        let mut config =
            skiff_pki::transport::client_config(&self.admin_files()).expect("the administrator's TLS configuration");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(http).await.unwrap_or_else(|e| panic!("connect to {http}: {e}"));
        let host = http.rsplit_once(':').map_or(http, |(host, _)| host).to_string();
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host).expect("a member's address");
        let mut stream = tls.connect(name, tcp).await.unwrap_or_else(|e| panic!("TLS to {http}: {e}"));
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "connection closed in the response head");
            head.push(byte[0]);
        }
        (stream, String::from_utf8_lossy(&head).into_owned())
    }

    /// `GET path` on the HTTP listener at `http` (see
    /// [`InProcessCluster::http_open`]): the whole response, head first.
    pub async fn http_get(&self, http: &str, path: &str) -> String {
        let (mut stream, mut response) = self.http_open(http, path).await;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await.unwrap_or_else(|e| panic!("GET {path} from {http}: {e}"));
        response.push_str(&String::from_utf8_lossy(&body));
        response
    }

    fn admin_files(&self) -> ClientFiles {
        ClientFiles {
            ca: self.pki.join("ca.crt"),
            cert: Some((self.pki.join("admin.crt"), self.pki.join("admin.key"))),
        }
    }

    /// The leader every running member agrees on.
    pub async fn must_leader(&self) -> NodeId {
        self.must_leader_of(&self.running_ids()).await
    }

    /// The leader members `ids` agree on, one of them: the majority's
    /// leader during a partition, whatever the minority believes.
    pub async fn must_leader_of(&self, ids: &[NodeId]) -> NodeId {
        let what = format!("a leader among members {ids:?} that they agree on");
        must_eventually(&what, LEADER_WITHIN, || async move {
            let seen: Vec<Option<NodeId>> = ids
                .iter()
                .map(|id| self.members.get(id).and_then(|m| m.running.as_ref()).and_then(|r| r.store.leader()))
                .collect();
            match seen.first() {
                Some(Some(leader)) if ids.contains(leader) && seen.iter().all(|s| *s == Some(*leader)) => Ok(*leader),
                _ => Err(format!("leaders seen: {seen:?}")),
            }
        })
        .await
    }

    /// The running members other than the leader.
    pub async fn followers(&self) -> Vec<NodeId> {
        let leader = self.must_leader().await;
        self.running_ids().into_iter().filter(|id| *id != leader).collect()
    }

    /// The client addresses of the first two followers.
    pub async fn follower_clients(&self) -> (String, String) {
        let followers = self.followers().await;
        assert!(followers.len() >= 2, "two followers are running: {followers:?}");
        (self.client(followers[0]).to_string(), self.client(followers[1]).to_string())
    }

    /// Stops member `id` as its process would on SIGTERM: its client streams
    /// end, requests in flight get a short grace period, then Raft stops. Its
    /// data dir and addresses stay, for [`InProcessCluster::restart`].
    pub async fn stop(&mut self, id: NodeId) -> Result<(), RunError> {
        let running = self.take_running(id);
        running.stop().await
    }

    /// Kills member `id`: it is cut off from every peer at once (each peer
    /// call to or from it fails as unreachable, as when a process dies),
    /// then stopped. Its data dir and addresses stay, for
    /// [`InProcessCluster::restart`]. In one process this is not a power
    /// loss: what the member wrote stays written, as after a SIGKILL.
    pub async fn kill(&mut self, id: NodeId) {
        let running = self.take_running(id);
        self.killed.insert(id);
        self.apply_filter();
        // Whatever the stop reports, the member is gone, as after a kill.
        let _ = running.stop().await;
    }

    /// Starts stopped or killed member `id` again, on its data dir and its
    /// addresses, and lets its peer calls through again (except those a
    /// partition still blocks). Returns once it serves; it catches up with
    /// the cluster in its own time.
    pub async fn restart(&mut self, id: NodeId) {
        let member = self.members.get(&id).unwrap_or_else(|| panic!("no member {id}"));
        assert!(member.running.is_none(), "member {id} is running");
        // Reachable before it starts: a member that hears no leader campaigns
        // (openraft 0.9 has no pre-vote) and would depose the leader later.
        self.killed.remove(&id);
        self.apply_filter();
        let running = start(&member.config, &self.security).await;
        self.members.get_mut(&id).expect("checked above").running = Some(running);
    }

    /// Partitions members `a` from members `b`: no peer call goes from one
    /// side to the other, in either direction, until [`InProcessCluster::heal`].
    /// Partitions add up; members in neither group are not affected.
    pub fn partition(&mut self, a: &[NodeId], b: &[NodeId]) {
        for &x in a {
            for &y in b {
                assert_ne!(x, y, "member {x} is on both sides of the partition");
                self.partitions.insert((x, y));
                self.partitions.insert((y, x));
            }
        }
        self.apply_filter();
    }

    /// Ends every partition (killed members stay cut off until restarted).
    pub fn heal(&mut self) {
        self.partitions.clear();
        self.apply_filter();
    }

    /// Stops every running member; panics if one does not stop cleanly.
    pub async fn shutdown(mut self) {
        for id in self.running_ids() {
            if let Err(e) = self.stop(id).await {
                panic!("member {id} did not stop cleanly: {e}");
            }
        }
    }

    /// Sets the shared filter to the partitions and the killed members.
    fn apply_filter(&self) {
        let cut_off = self.killed.iter().flat_map(|&k| self.members.keys().flat_map(move |&m| [(k, m), (m, k)]));
        self.filter.set_blocked(self.partitions.iter().copied().chain(cut_off));
    }

    fn running(&self, id: NodeId) -> &Running {
        let member = self.members.get(&id).unwrap_or_else(|| panic!("no member {id}"));
        member.running.as_ref().unwrap_or_else(|| panic!("member {id} is not running"))
    }

    fn take_running(&mut self, id: NodeId) -> Running {
        let member = self.members.get_mut(&id).unwrap_or_else(|| panic!("no member {id}"));
        member.running.take().unwrap_or_else(|| panic!("member {id} is not running"))
    }

    fn index(&self, id: NodeId) -> usize {
        assert!(self.members.contains_key(&id), "no member {id}");
        (id - 1) as usize
    }
}

/// Makes the cluster's CA in `dir` and issues the certificates: the
/// members' serving one and their shared peer one (both for 127.0.0.1), and
/// the administrator's (`root` in `system:masters`).
fn issue_certificates(dir: &Path) {
    let ca = skiff_pki::issue_member_certificates(dir, "skiff-test-ca", &["127.0.0.1".to_string()])
        .expect("the members' certificates");
    let admin = Profile::Client { user: "root".into(), groups: vec![MASTERS_GROUP.into()] };
    ca.issue(&admin, DEFAULT_VALIDITY).and_then(|issued| issued.write(dir, "admin")).expect("admin");
}

/// Binds `config`'s addresses and starts the member. Retries while the
/// ports or the RocksDB files of its previous run in this process are still
/// being released (both are, in moments, once that run's tasks end).
async fn start(config: &ApiserverConfig, security: &Security) -> Running {
    let id = config.store.id;
    must_eventually(&format!("member {id} started"), START_WITHIN, || async move {
        let attempt = async {
            let listeners = Listeners::bind(config).await?;
            skiff_apiserver::start_with(config.clone(), listeners, security.clone()).await
        };
        match attempt.await {
            Ok(running) => Ok(running),
            Err(e @ (RunError::Listen { .. } | RunError::Start(StartError::Storage(_)))) => Err(e),
            Err(e) => panic!("member {id} failed to start: {e}"),
        }
    })
    .await
}
