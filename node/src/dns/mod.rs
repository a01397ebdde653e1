//! The cluster DNS server of the node's pods, node-local: what CoreDNS's
//! kubernetes plugin serves (Services, their endpoints, pods; see
//! [`records`]) and forwarding for every other name, as NodeLocal
//! DNSCache puts it on each node.
//!
//! Each agent serves the pods of its own node, at its pod bridge's gateway
//! address (their `nameserver`), so the cluster needs no DNS pod, no
//! Service for it and no hop to another node for a lookup, and a node's
//! DNS lives and dies with the node. Other names go to the host's own
//! nameservers (its resolv.conf, read by the caller), which the agent
//! reaches from the host's network namespace even when they are loopback
//! addresses such as systemd-resolved's 127.0.0.53.
//!
//! Data flows one way: the Service and EndpointSlice informers → a
//! [`Records`] table, rebuilt whole after each burst of changes → a
//! `watch` channel → the [`server`]'s query tasks, which each read the
//! latest table. The server starts once both informers have listed, as
//! CoreDNS waits for its first sync: a pod never hears NXDOMAIN for a
//! Service that exists, only waits (queries sit in the sockets' buffers).
//!
//! # Layout
//! - [`records`]: the table and its lookups, pure.
//! - [`server`]: the sockets, the UDP and TCP loops, forwarding.

pub mod records;
pub mod server;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skiff_client::runtime::informer::{Informer, Informers};
use skiff_shutdown::Shutdown;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;

pub use records::{Lookup, Records};

/// How long a change waits for the rest of its burst (a rollout's slice
/// updates, a relist) before the table is rebuilt once for all of it.
const COALESCE: Duration = Duration::from_millis(50);

/// Serves the cluster's DNS on `listen` (UDP and TCP) until `shutdown`:
/// names under `domain` (`cluster.local`) from the Services and
/// EndpointSlices, other names forwarded to `upstreams`. Returns once the
/// sockets are bound (an invalid domain or a failed bind is the error);
/// the serving runs on `shutdown`.
pub async fn run(
    informers: &Informers,
    listen: SocketAddr,
    domain: String,
    upstreams: Vec<SocketAddr>,
    shutdown: Shutdown,
) -> io::Result<()> {
    if records::parse_domain(&domain).is_none() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{domain:?} is not a domain name")));
    }
    let (udp, tcp) = server::bind(listen)?;
    let (services, slices) = (informers.informer::<Service>(), informers.informer::<EndpointSlice>());
    tracing::info!(%listen, %domain, ?upstreams, "cluster DNS");
    shutdown.spawn(follow(services, slices, domain, (udp, tcp), upstreams, shutdown.clone()));
    Ok(())
}

/// Starts the server once both informers have listed, then rebuilds its
/// table after each burst of changes until `shutdown` (or until an
/// informer ends; the server keeps the last table).
async fn follow(
    services: Informer<Service>,
    slices: Informer<EndpointSlice>,
    domain: String,
    (udp, tcp): (UdpSocket, TcpListener),
    upstreams: Vec<SocketAddr>,
    shutdown: Shutdown,
) {
    // Subscribed before the stores are read: no change is missed.
    let (mut service_changes, mut slice_changes) = (services.subscribe(), slices.subscribe());
    let (service_store, slice_store) = (services.store(), slices.store());
    let ready = async {
        service_store.wait_until_ready().await?;
        slice_store.wait_until_ready().await
    };
    tokio::select! {
        _ = shutdown.cancelled() => return,
        ready = ready => if ready.is_err() { return },
    }
    let build = || Arc::new(Records::build(&domain, &service_store.list(), &slice_store.list()));
    let (table, records) = watch::channel(build());
    shutdown.spawn(server::serve(udp, tcp, records, upstreams, shutdown.clone()));
    loop {
        let changed = tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = service_changes.recv() => changed.is_some(),
            changed = slice_changes.recv() => changed.is_some(),
        };
        if !changed {
            return;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(COALESCE) => {}
        }
        // What arrived meanwhile is in the stores already.
        while let Some(Some(_)) = service_changes.recv().now_or_never() {}
        while let Some(Some(_)) = slice_changes.recv().now_or_never() {}
        table.send_replace(build());
    }
}

/// The nameservers of a resolv.conf, at port 53, in order; lines that are
/// not `nameserver <IP address>` are skipped (a scoped IPv6 address too).
pub fn upstreams_from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then_some(())?;
            words.next()?.parse::<IpAddr>().ok()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    use serde_json::json;
    use skiff_client::runtime::fake::FakeSource;
    use skiff_client::runtime::watcher::WatcherConfig;
    use std::str::FromStr;

    #[test]
    fn resolv_conf_nameservers_become_upstreams_at_port_53() {
        let text = "# generated\nsearch example.com\nnameserver 127.0.0.53\nnameserver  2001:db8::1 \n\
                    nameserver fe80::1%eth0\nnameserver not-an-ip\nnameserver\noptions edns0 trust-ad\n\
                    nameserver 192.0.2.53";
        let expected: Vec<SocketAddr> =
            ["127.0.0.53:53", "[2001:db8::1]:53", "192.0.2.53:53"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(upstreams_from_resolv_conf(text), expected);
        assert!(upstreams_from_resolv_conf("").is_empty());
    }

    async fn must_ask(server: SocketAddr, name: &str) -> Message {
        let mut query = Message::new(1, MessageType::Query, OpCode::Query);
        query.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(&query.to_vec().unwrap(), server).await.unwrap();
        let mut buffer = vec![0u8; 65535];
        let (len, _) =
            tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buffer)).await.unwrap().unwrap();
        Message::from_vec(&buffer[..len]).unwrap()
    }

    #[tokio::test]
    async fn the_served_records_follow_the_services() {
        let shutdown = Shutdown::new();
        let web = |ip: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"namespace": "default", "name": "web"},
                "spec": {"clusterIP": ip}}))
            .unwrap()
        };
        let source = FakeSource::new(vec![web("10.96.0.10")]);
        let services = Informer::spawn(source.clone(), WatcherConfig::default(), 16, &shutdown);
        let slices = Informer::spawn(FakeSource::<EndpointSlice>::default(), WatcherConfig::default(), 16, &shutdown);
        let sockets = server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let server = sockets.0.local_addr().unwrap();
        shutdown.spawn(follow(services, slices, "cluster.local".into(), sockets, vec![], shutdown.clone()));
        let answer = |reply: Message| reply.answers.iter().map(|r| r.data.to_string()).collect::<Vec<_>>();
        assert_eq!(answer(must_ask(server, "web.default.svc.cluster.local.").await), ["10.96.0.10"]);
        source.apply(web("10.96.0.20"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while answer(must_ask(server, "web.default.svc.cluster.local.").await) != ["10.96.0.20"] {
            assert!(tokio::time::Instant::now() < deadline, "the new address is never served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        source.delete("default", "web");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while must_ask(server, "web.default.svc.cluster.local.").await.metadata.response_code
            != hickory_proto::op::ResponseCode::NXDomain
        {
            assert!(tokio::time::Instant::now() < deadline, "the deleted service is still served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.stop().await;
    }
}
