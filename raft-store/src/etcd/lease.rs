//! etcd's Lease service.
//!
//! Grant and revoke are replicated commands; keep-alive and time-to-live
//! act on the leader's lease clocks (forwarded there by any member); the
//! lease list and attached keys come from this member's applied state.
//! While auth is enabled every call needs a valid token, and a revoke
//! needs write permission on every attached key.

use skiff_proto::etcdserverpb::lease_server::{Lease, LeaseServer};
use skiff_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesRequest,
    LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::error::StoreError;
use crate::etcd::{auth, header};
use crate::store::Store;
use crate::types::ApplyError;

/// The Lease service of one member.
pub struct LeaseService {
    store: Store,
}

impl LeaseService {
    pub fn server(store: Store) -> LeaseServer<LeaseService> {
        LeaseServer::new(LeaseService { store })
    }
}

type KeepAliveStream = super::ResponseStream<LeaseKeepAliveResponse>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(&self, request: Request<LeaseGrantRequest>) -> Result<Response<LeaseGrantResponse>, Status> {
        auth::caller(&self.store, request.metadata())?;
        let req = request.into_inner();
        let (id, ttl) = self.store.lease_grant(req.id, req.ttl).await?;
        Ok(Response::new(LeaseGrantResponse {
            header: Some(header(self.store.header())),
            id,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let caller = auth::caller(&self.store, request.metadata())?;
        let id = request.into_inner().id;
        // etcd's rule: revoking deletes the attached keys, so the user must
        // be allowed to write every one of them.
        if caller.user().is_some() {
            for key in self.store.lease_keys(id)? {
                caller.write(&key, &[])?;
            }
        }
        let revision = self.store.lease_revoke(id).await?;
        let mut h = header(self.store.header());
        h.revision = revision;
        Ok(Response::new(LeaseRevokeResponse { header: Some(h) }))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        auth::caller(&self.store, request.metadata())?;
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let store = self.store.clone();
        let task = store.clone();
        task.spawn_stream(async move {
            while let Some(Ok(req)) = requests.next().await {
                // etcd answers a keep-alive of an unknown lease with TTL 0.
                let response = match store.lease_keep_alive(req.id).await {
                    Ok(ttl) => Ok(LeaseKeepAliveResponse { header: Some(header(store.header())), id: req.id, ttl }),
                    Err(StoreError::Apply(ApplyError::LeaseNotFound { .. })) => {
                        Ok(LeaseKeepAliveResponse { header: Some(header(store.header())), id: req.id, ttl: 0 })
                    }
                    Err(e) => Err(Status::from(e)),
                };
                if tx.send(response).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(super::until_stopping(&self.store, rx)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        auth::caller(&self.store, request.metadata())?;
        let req = request.into_inner();
        // etcd answers for an unknown (or expired) lease with TTL -1.
        let (granted_ttl, ttl) = match self.store.lease_time_to_live(req.id).await {
            Ok(t) => t,
            Err(StoreError::Apply(ApplyError::LeaseNotFound { .. })) => (0, -1),
            Err(e) => return Err(e.into()),
        };
        let keys = if req.keys { self.store.lease_keys(req.id)? } else { Vec::new() };
        Ok(Response::new(LeaseTimeToLiveResponse {
            header: Some(header(self.store.header())),
            id: req.id,
            ttl,
            granted_ttl,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        auth::caller(&self.store, request.metadata())?;
        let leases = self.store.leases()?.into_iter().map(|(id, _)| LeaseStatus { id }).collect();
        Ok(Response::new(LeaseLeasesResponse { header: Some(header(self.store.header())), leases }))
    }
}
