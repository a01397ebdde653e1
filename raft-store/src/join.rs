//! The client side of `--join`: ask a running member to add this one.

use std::time::Duration;

use skiff_proto::control::control_client::ControlClient;
use skiff_proto::control::JoinRequest;

use crate::types::{MemberInfo, NodeId};

/// Why joining through a running member failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("bad --join address {addr}: {source}")]
    BadAddress {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot reach the cluster at {addr}: {source}")]
    Unreachable {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the cluster at {addr} refused to add member {id}: {}", .status.message())]
    Refused {
        addr: String,
        id: NodeId,
        #[source]
        status: tonic::Status,
    },
}

/// Asks the member at `client_addr` to add `info` to its cluster and waits
/// until it is a voter, over `tls` if given (presenting this member's peer
/// certificate, which the cluster checks before it adds anyone). Returns
/// the cluster id.
pub async fn request_join(
    client_addr: &str,
    info: &MemberInfo,
    timeout: Duration,
    tls: Option<&skiff_pki::Connector>,
) -> Result<u64, JoinError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = match client_addr.split_once("://") {
        Some((_, rest)) => format!("{scheme}://{rest}"),
        None => format!("{scheme}://{client_addr}"),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|source| JoinError::BadAddress { addr: client_addr.to_string(), source })?
        .connect_timeout(Duration::from_secs(3));
    let deadline = tokio::time::Instant::now() + timeout;
    // The cluster may be starting too: retry connecting until the deadline.
    let channel = loop {
        let connected = match tls {
            Some(tls) => endpoint.connect_with_connector(tls.clone()).await,
            None => endpoint.connect().await,
        };
        match connected {
            Ok(c) => break c,
            Err(e) if tokio::time::Instant::now() + Duration::from_millis(500) < deadline => {
                tracing::info!(error = %e, "cluster at {client_addr} not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(source) => return Err(JoinError::Unreachable { addr: client_addr.to_string(), source }),
        }
    };
    let mut client = ControlClient::new(channel);
    let mut request = tonic::Request::new(JoinRequest {
        id: info.id,
        name: info.name.clone(),
        peer_urls: info.peer_urls.clone(),
        client_urls: info.client_urls.clone(),
        incarnation: info.incarnation,
        timeout_ms: timeout.as_millis() as u64,
    });
    request.set_timeout(timeout + Duration::from_secs(5));
    let response = client.join(request).await.map_err(|status| JoinError::Refused {
        addr: client_addr.to_string(),
        id: info.id,
        status,
    })?;
    Ok(response.into_inner().cluster_id)
}
