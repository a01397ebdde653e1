//! etcd's Cluster service: membership as `etcdctl member ...` sees it.
//!
//! Changes run on the leader through [`Store::admin`] (forwarded there if
//! need be). A member's name and client URLs are what it published through
//! the log after starting, so a member added with `MemberAdd` is listed
//! with an empty name until it starts, as in etcd. Lists are read from this
//! member's view of the membership; after a change, the response is
//! adjusted so it shows the change even if this member has not applied it yet.

use skiff_proto::etcdserverpb::cluster_server::{Cluster, ClusterServer};
use skiff_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse,
    ResponseHeader,
};
use tonic::{Request, Response, Status};

use crate::error::StoreError;
use crate::etcd::header;
use crate::etcd::status::unexpected;
use crate::store::{AdminRequest, AdminResponse, MemberView, Store};

/// etcd's error for a peer URL that does not parse.
const BAD_URLS: &str = "etcdserver: given member URLs are invalid";

/// The Cluster service of one member.
#[derive(Clone)]
pub struct ClusterService {
    store: Store,
}

impl ClusterService {
    /// The Cluster service as a tonic server.
    pub fn server(store: Store) -> ClusterServer<ClusterService> {
        ClusterServer::new(ClusterService { store })
    }

    /// etcd 3.4's Cluster header: cluster, member and term, no revision.
    fn header(&self) -> Option<ResponseHeader> {
        Some(ResponseHeader { revision: 0, ..header(self.store.header()) })
    }

    fn members(&self) -> Vec<Member> {
        self.store.members().into_iter().map(member).collect()
    }

    /// Runs a change that answers `Done`.
    async fn change(&self, request: AdminRequest) -> Result<(), Status> {
        match self.store.admin(request).await? {
            AdminResponse::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn member(m: MemberView) -> Member {
    Member { id: m.id, name: m.name, peer_ur_ls: m.peer_urls, client_ur_ls: m.client_urls, is_learner: m.is_learner }
}

/// The peer address (`host:port`) in a member's peer URLs. Skiff members
/// have exactly one; the scheme (`http://` or `https://`) is optional.
pub(crate) fn peer_addr(urls: &[String]) -> Result<String, StoreError> {
    let [url] = urls else {
        return Err(StoreError::InvalidArgument(format!(
            "a Skiff member has exactly one peer URL (host:port), got {}",
            urls.len()
        )));
    };
    let bad = || StoreError::InvalidArgument(BAD_URLS.into());
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")).unwrap_or(url);
    let addr = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(addr.to_string())
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(&self, request: Request<MemberAddRequest>) -> Result<Response<MemberAddResponse>, Status> {
        // etcd lets only the root role change membership.
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let request = request.into_inner();
        let addr = peer_addr(&request.peer_ur_ls)?;
        let learner = request.is_learner;
        let id = match self.store.admin(AdminRequest::Add { peer_addr: addr.clone(), learner }).await? {
            AdminResponse::Added { id } => id,
            other => return Err(unexpected(other)),
        };
        let added = member(MemberView {
            id,
            name: String::new(),
            peer_urls: vec![format!("http://{addr}")],
            client_urls: Vec::new(),
            is_learner: learner,
        });
        let mut members = self.members();
        if !members.iter().any(|m| m.id == id) {
            members.push(added.clone());
        }
        Ok(Response::new(MemberAddResponse { header: self.header(), member: Some(added), members }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let id = request.into_inner().id;
        self.change(AdminRequest::Remove { id }).await?;
        let mut members = self.members();
        members.retain(|m| m.id != id);
        Ok(Response::new(MemberRemoveResponse { header: self.header(), members }))
    }

    /// A member's new peer URL, replicated as a membership change; restart
    /// the member with the matching `--peer-listen`.
    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let request = request.into_inner();
        let addr = peer_addr(&request.peer_ur_ls)?;
        self.change(AdminRequest::Update { id: request.id, peer_addr: addr.clone() }).await?;
        let mut members = self.members();
        if let Some(m) = members.iter_mut().find(|m| m.id == request.id) {
            m.peer_ur_ls = vec![format!("http://{addr}")];
        }
        Ok(Response::new(MemberUpdateResponse { header: self.header(), members }))
    }

    async fn member_list(&self, request: Request<MemberListRequest>) -> Result<Response<MemberListResponse>, Status> {
        if request.into_inner().linearizable {
            self.store.linearize().await?;
        }
        Ok(Response::new(MemberListResponse { header: self.header(), members: self.members() }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let id = request.into_inner().id;
        self.change(AdminRequest::Promote { id }).await?;
        let mut members = self.members();
        members.iter_mut().filter(|m| m.id == id).for_each(|m| m.is_learner = false);
        Ok(Response::new(MemberPromoteResponse { header: self.header(), members }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn peer_urls_parse_to_host_and_port() {
        assert_eq!(peer_addr(&urls(&["http://10.0.0.1:2380"])), Ok("10.0.0.1:2380".into()));
        assert_eq!(peer_addr(&urls(&["https://node-2:2380/"])), Ok("node-2:2380".into()));
        assert_eq!(peer_addr(&urls(&["[::1]:2380"])), Ok("[::1]:2380".into()));
        for bad in ["http://node", "node:http", "http://:2380", "unix://sock:1", "http://a:2380/path"] {
            assert_eq!(peer_addr(&urls(&[bad])), Err(StoreError::InvalidArgument(BAD_URLS.into())), "{bad}");
        }
        assert!(peer_addr(&[]).is_err());
        assert!(peer_addr(&urls(&["http://a:1", "http://b:1"])).is_err());
    }
}
