//! `skiffctl token`: join tokens (`K10<CA hash>::<id>.<secret>`), stored as
//! Kubernetes bootstrap token Secrets in `kube-system`.
//!
//! - `token create [--ttl 24h] [--usages join-node] [--description D]`
//!   prints a new token; the CA hash is of `--certificate-authority`.
//! - `token list`: ids, expiry, usages (never the secrets).
//! - `token delete ID`: revokes a token at once (its Secret goes).

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use skiff_api::resources::{self, Kind};
use skiff_client::resources::{DeleteParams, ListParams};
use skiff_client::Client;
use skiff_pki::token::JoinToken;

use skiff_pki::token::{JOIN_MASTER_GROUP, JOIN_NODE_GROUP, NAMESPACE, SECRET_PREFIX, SECRET_TYPE};

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a join token and print it (K10<CA hash>::<id>.<secret>).
    Create(CreateArgs),
    /// List the join tokens: ids, expiry and usages, never secrets.
    List,
    /// Revoke a join token (by id, or the whole token).
    Delete { token: String },
}

#[derive(Args)]
pub struct CreateArgs {
    /// How long the token may be used (`24h`, `30m`); `0` never expires.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// What the token is for: `join-node` (a node gets its own certificate
    /// with it: `skiff node --token`), `join-master` (a new master gets its
    /// certificates and the keys every master shares: `skiff apiserver
    /// --join ADDR --token`; it makes its holder a master, so keep its ttl
    /// short), or both, comma-separated.
    #[arg(long, default_value = "join-node")]
    pub usages: String,
    /// A note shown by `token list`.
    #[arg(long, default_value = "")]
    pub description: String,
}

/// The extra groups a token with these usages authenticates in.
fn groups_for(usages: &str) -> Result<Vec<&'static str>, String> {
    let mut groups = Vec::new();
    for usage in usages.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let group = match usage {
            "join-node" => JOIN_NODE_GROUP,
            "join-master" => JOIN_MASTER_GROUP,
            other => return Err(format!("--usages {other:?}: expected join-node or join-master")),
        };
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    if groups.is_empty() {
        return Err("--usages: name at least one (join-node, join-master)".into());
    }
    Ok(groups)
}

/// The bootstrap token Secret for `token`.
fn secret(token: &JoinToken, ttl: Duration, groups: &[&str], description: &str) -> Value {
    let mut data = json!({
        "token-id": token.id,
        "token-secret": token.secret,
        "usage-bootstrap-authentication": "true",
        "auth-extra-groups": groups.join(","),
    });
    if !ttl.is_zero() {
        let expires = chrono::Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        data["expiration"] = json!(expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    if !description.is_empty() {
        data["description"] = json!(description);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{SECRET_PREFIX}{}", token.id), "namespace": NAMESPACE},
        "type": SECRET_TYPE,
        "stringData": data,
    })
}

fn data(secret: &Value, key: &str) -> String {
    use base64::Engine;
    secret["data"][key]
        .as_str()
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

pub async fn run(client: &Client, ca: Option<&std::path::Path>, command: TokenCommand) -> Result<(), String> {
    let info = resources::of(Kind::Secret);
    match command {
        TokenCommand::Create(args) => {
            let groups = groups_for(&args.usages)?;
            let ca = ca.ok_or("token create: --certificate-authority names the cluster CA the token pins")?;
            let ca_pem = std::fs::read_to_string(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            let token = JoinToken::generate(&ca_pem).map_err(|e| e.to_string())?;
            let obj = secret(&token, args.ttl, &groups, &args.description);
            client.create(info, NAMESPACE, &obj).await.map_err(|e| e.to_string())?;
            println!("{token}");
        }
        TokenCommand::List => {
            let list = client.list_all(info, NAMESPACE, &ListParams::default()).await.map_err(|e| e.to_string())?;
            println!("{:<8} {:<22} {:<42} DESCRIPTION", "ID", "EXPIRES", "EXTRA GROUPS");
            for s in list.items.iter().filter(|s| s["type"] == SECRET_TYPE) {
                let expires = data(s, "expiration");
                let expires = if expires.is_empty() { "<forever>".to_string() } else { expires };
                println!(
                    "{:<8} {:<22} {:<42} {}",
                    data(s, "token-id"),
                    expires,
                    data(s, "auth-extra-groups"),
                    data(s, "description")
                );
            }
        }
        TokenCommand::Delete { token } => {
            // A whole token or an id: the id is what names the Secret.
            let id = match JoinToken::parse(&token) {
                Ok(t) => t.id,
                Err(_) => token.trim().to_string(),
            };
            let name = format!("{SECRET_PREFIX}{id}");
            client.delete(info, NAMESPACE, &name, &DeleteParams::background()).await.map_err(|e| e.to_string())?;
            println!("token {id} revoked");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_secret_has_kubeadms_keys_and_only_known_usages_are_taken() {
        let token = JoinToken::parse("abcdef.0123456789abcdef").unwrap();
        let s = secret(&token, Duration::from_secs(3600), &[JOIN_NODE_GROUP], "for n1");
        assert_eq!(s["metadata"]["name"], "bootstrap-token-abcdef");
        assert_eq!(s["type"], SECRET_TYPE);
        assert_eq!(s["stringData"]["token-secret"], "0123456789abcdef");
        assert_eq!(s["stringData"]["usage-bootstrap-authentication"], "true");
        assert!(s["stringData"]["expiration"].as_str().unwrap().ends_with('Z'));
        assert!(secret(&token, Duration::ZERO, &[JOIN_NODE_GROUP], "")["stringData"]["expiration"].is_null());
        assert_eq!(groups_for("join-node").unwrap(), vec![JOIN_NODE_GROUP]);
        assert_eq!(groups_for("join-master").unwrap(), vec![JOIN_MASTER_GROUP]);
        assert_eq!(groups_for("join-node, join-master,join-node").unwrap(), vec![JOIN_NODE_GROUP, JOIN_MASTER_GROUP]);
        assert!(groups_for("signing").is_err());
    }
}
