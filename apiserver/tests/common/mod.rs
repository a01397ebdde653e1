//! An in-process cluster of apiservers for the tests of this crate.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use skiff_apiserver::admission::Security;
use skiff_apiserver::{ApiserverConfig, Listeners, Running};
use skiff_raft_store::StoreConfig;

pub struct InProcessCluster {
    _dir: tempfile::TempDir,
    pub members: Vec<Running>,
    pub clients: Vec<String>,
    pub https: Vec<String>,
}

impl InProcessCluster {
    pub async fn spawn(n: u64) -> Self {
        Self::spawn_with(n, Security::default()).await
    }

    /// A cluster whose members run `security`'s layers.
    pub async fn spawn_with(n: u64, security: Security) -> Self {
        Self::spawn_configured(n, security, |_| {}).await
    }

    /// A cluster whose members' store settings `tweak` adjusts.
    pub async fn spawn_configured(n: u64, security: Security, tweak: impl Fn(&mut StoreConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = Vec::new();
        for _ in 0..n {
            let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            listeners.push(Listeners { peer, client, http });
        }
        let initial: BTreeMap<u64, String> =
            listeners.iter().enumerate().map(|(i, l)| (i as u64 + 1, l.addrs().0.to_string())).collect();
        let clients: Vec<String> = listeners.iter().map(|l| l.addrs().1.to_string()).collect();
        let https: Vec<String> = listeners.iter().map(|l| l.addrs().2.to_string()).collect();
        let starts = listeners.into_iter().enumerate().map(|(i, l)| {
            let id = i as u64 + 1;
            let (peer, client, http) = l.addrs();
            let mut store = StoreConfig::new(id, dir.path().join(format!("m{id}")), peer.to_string());
            store.initial_cluster = initial.clone();
            store.client_urls = vec![format!("http://{client}")];
            tweak(&mut store);
            let config = ApiserverConfig {
                store,
                peer_listen: peer.to_string(),
                client_listen: client.to_string(),
                http_listen: http.to_string(),
                watch_progress_interval: Duration::from_millis(300),
                watch_bookmark_interval: Duration::from_millis(300),
            };
            skiff_apiserver::start_with(config, l, security.clone())
        });
        let members = futures_join(starts).await;
        let cluster = InProcessCluster { _dir: dir, members, clients, https };
        cluster.must_leader().await;
        cluster
    }

    pub async fn must_leader(&self) -> u64 {
        for _ in 0..300 {
            let leaders: Vec<_> = self.members.iter().map(|m| m.store.leader()).collect();
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| *x == Some(*l)) {
                    return *l;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader");
    }

    pub async fn follower_clients(&self) -> (String, String) {
        let leader = self.must_leader().await as usize;
        let followers: Vec<&String> =
            self.clients.iter().enumerate().filter(|(i, _)| i + 1 != leader).map(|(_, c)| c).collect();
        (followers[0].clone(), followers[1].clone())
    }
}

async fn futures_join<F: std::future::Future<Output = Result<Running, skiff_apiserver::RunError>>>(
    starts: impl Iterator<Item = F>,
) -> Vec<Running> {
    let handles: Vec<_> = starts.map(|f| async move { f.await.unwrap() }).collect();
    let mut out = Vec::new();
    // Members must start concurrently: each one's bootstrap probes the others.
    let joined = futures::future::join_all(handles).await;
    out.extend(joined);
    out
}
