//! Connections to a cluster through the real `etcd-client` crate, member
//! status, and finding the leader. Nothing here knows which system it talks to.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions, GetOptions};

/// Which members a scenario sends its requests to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// The current leader only (no forwarding hop; how etcd's own benchmark reports writes).
    Leader,
    /// Every member, connections spread round-robin.
    All,
}

impl Target {
    pub fn describe(self) -> &'static str {
        match self {
            Target::Leader => "the leader",
            Target::All => "all members",
        }
    }
}

/// A client connected to exactly one member. `request_timeout` bounds every
/// unary call; watch streams need `None` (the timeout would end the stream).
pub async fn connect(endpoint: &str, request_timeout: Option<Duration>) -> Result<Client> {
    let mut options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
    if let Some(timeout) = request_timeout {
        options = options.with_timeout(timeout);
    }
    let scheme = match crate::tls::get() {
        Some(tls) => {
            options = options.with_tls(tls.etcd.clone());
            "https"
        }
        None => "http",
    };
    Client::connect([format!("{scheme}://{endpoint}")], Some(options))
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

/// What one member says about itself and the cluster.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
}

/// Asks `endpoint` for its status, within two seconds.
pub async fn status(endpoint: &str) -> Result<MemberStatus> {
    let ask = async {
        let mut client = connect(endpoint, Some(Duration::from_secs(2))).await?;
        let status = client.status().await?;
        let member_id = status.header().map(|h| h.member_id()).unwrap_or(0);
        Ok::<_, anyhow::Error>(MemberStatus { member_id, leader: status.leader() })
    };
    tokio::time::timeout(Duration::from_secs(2), ask).await.context("status timed out")?
}

/// The index (into `endpoints`) of the leader that every endpoint agrees on,
/// waiting up to `within` for an election to settle.
pub async fn agreed_leader(endpoints: &[String], within: Duration) -> Result<usize> {
    let deadline = Instant::now() + within;
    loop {
        let mut statuses = Vec::new();
        for endpoint in endpoints {
            statuses.push(status(endpoint).await.ok());
        }
        if let Some(leader) = agreement(&statuses) {
            return Ok(leader);
        }
        if Instant::now() >= deadline {
            bail!("no leader agreed by {endpoints:?} within {within:?}: {statuses:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The position of the member every status names as leader, if all answered and agree.
fn agreement(statuses: &[Option<MemberStatus>]) -> Option<usize> {
    let answered: Vec<&MemberStatus> = statuses.iter().flatten().collect();
    if answered.len() != statuses.len() || answered.is_empty() {
        return None;
    }
    let leader = answered[0].leader;
    if leader == 0 || answered.iter().any(|s| s.leader != leader) {
        return None;
    }
    answered.iter().position(|s| s.member_id == leader)
}

/// The endpoints a scenario with `target` sends to.
pub async fn resolve(endpoints: &[String], target: Target) -> Result<Vec<String>> {
    match target {
        Target::All => Ok(endpoints.to_vec()),
        Target::Leader => {
            let leader = agreed_leader(endpoints, Duration::from_secs(30)).await?;
            Ok(vec![endpoints[leader].clone()])
        }
    }
}

/// Writes a marker through `endpoints[0]` and waits until every endpoint
/// serves it from its own state (a serializable read), so a member that was
/// just restarted has caught up before the next measurement.
pub async fn must_catch_up(endpoints: &[String], within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let key = "skiff-bench/catch-up";
    let revision = loop {
        let attempt = async {
            let mut client = connect(&endpoints[0], Some(Duration::from_secs(5))).await?;
            let response = client.put(key, "x", None).await?;
            Ok::<_, anyhow::Error>(response.header().map(|h| h.revision()).unwrap_or(0))
        };
        match attempt.await {
            Ok(revision) => break revision,
            Err(e) if Instant::now() >= deadline => return Err(e.context("catch-up marker write")),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    for endpoint in endpoints {
        loop {
            let seen = async {
                let mut client = connect(endpoint, Some(Duration::from_secs(2))).await?;
                let response = client.get(key, Some(GetOptions::new().with_serializable())).await?;
                Ok::<_, anyhow::Error>(response.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0))
            };
            match seen.await {
                Ok(seen) if seen >= revision => break,
                _ if Instant::now() >= deadline => bail!("{endpoint} did not catch up to revision {revision}"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(member_id: u64, leader: u64) -> Option<MemberStatus> {
        Some(MemberStatus { member_id, leader })
    }

    #[test]
    fn leader_is_agreed_only_when_every_member_answers_the_same() {
        assert_eq!(agreement(&[s(7, 9), s(9, 9), s(8, 9)]), Some(1));
        assert_eq!(agreement(&[s(7, 9), s(9, 9), None]), None);
        assert_eq!(agreement(&[s(7, 9), s(9, 8), s(8, 8)]), None);
        assert_eq!(agreement(&[s(7, 0), s(9, 0)]), None);
        // Everyone names a leader that is not among them (just killed).
        assert_eq!(agreement(&[s(7, 5), s(9, 5)]), None);
        assert_eq!(agreement(&[]), None);
    }
}
