//! A member's RBAC authorizer: the [`Policy`] of the roles and bindings
//! its store holds, rebuilt whenever one of them changes, as kube-apiserver
//! follows them with informers. A change applied on this member is in force
//! for the next request a moment later (the rebuild reads four small
//! ranges); until the first policy is built, everyone but `system:masters`
//! is refused.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::select_all;
use serde_json::Value;
use skiff_api::resources::{self, Kind};
use skiff_api::ApiError;
use skiff_shutdown::Shutdown;

use super::{covers, Action, Policy, Rule};
use crate::admission::{Attributes, Authorizer, UserInfo};
use crate::storage::{prefix_end, Consistency, ObjectStore};

const KINDS: [Kind; 4] = [Kind::Role, Kind::ClusterRole, Kind::RoleBinding, Kind::ClusterRoleBinding];
/// How long to wait before trying again after a failed read.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Rbac {
    policy: Arc<RwLock<Option<Arc<Policy>>>>,
}

impl Rbac {
    /// Builds the policy from `store` and keeps it current until `shutdown`.
    pub fn start(objects: ObjectStore, shutdown: &Shutdown) -> Rbac {
        let rbac = Rbac { policy: Arc::new(RwLock::new(None)) };
        let follower = rbac.clone();
        let stopped = shutdown.cancelled_owned();
        shutdown.spawn(async move {
            tokio::select! {
                () = follower.follow(objects) => {}
                () = stopped => {}
            }
        });
        rbac
    }

    fn current(&self) -> Option<Arc<Policy>> {
        self.policy.read().expect("rbac lock poisoned").clone()
    }

    async fn follow(&self, objects: ObjectStore) {
        let store = objects.store.clone();
        loop {
            // Subscribe before reading: no change after the read is missed.
            let mut feeds: Vec<_> = KINDS
                .iter()
                .map(|kind| {
                    let prefix = resources::of(*kind).prefix().into_bytes();
                    store.subscribe(&prefix, &prefix_end(&prefix), None)
                })
                .collect();
            loop {
                match load(&objects).await {
                    Ok(policy) => *self.policy.write().expect("rbac lock poisoned") = Some(Arc::new(policy)),
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the RBAC policy");
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
                let (changed, _, _) = select_all(feeds.iter_mut().map(|f| Box::pin(f.next()))).await;
                if let Err(e) = changed {
                    // Compacted past us, or the store stopped: start over.
                    tracing::debug!(error = %e, "RBAC feed ended");
                    tokio::time::sleep(RETRY).await;
                    break;
                }
            }
        }
    }
}

async fn load(objects: &ObjectStore) -> Result<Policy, ApiError> {
    let revision = objects.prepare_read(Consistency::Any).await?;
    let mut lists: Vec<Vec<Value>> = Vec::new();
    for kind in KINDS {
        let prefix = resources::of(kind).prefix();
        let page = objects.range(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), revision, 0).await?;
        lists.push(page.items.iter().map(|s| s.decode()).collect::<Result<_, _>>()?);
    }
    Ok(Policy::new(&lists[0], &lists[1], &lists[2], &lists[3]))
}

impl Authorizer for Rbac {
    fn authorize(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String> {
        let Some(policy) = self.current() else {
            return Err("the RBAC policy is not loaded yet".into());
        };
        if policy.allows(user, action) {
            Ok(())
        } else {
            Err(action.denial(user))
        }
    }

    fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<Vec<Rule>> {
        Some(self.current()?.rules_for(user, namespace))
    }

    /// Kubernetes' escalation prevention: a user may write a role only with
    /// rules they hold themselves (or with `escalate` on it), and bind a
    /// role only if they hold its rules (or with `bind` on it).
    fn check_escalation(&self, user: &UserInfo, attrs: &Attributes<'_>, obj: &Value) -> Result<(), String> {
        let kind = attrs.resource.kind_id;
        if !KINDS.contains(&kind) || !matches!(attrs.verb, "create" | "update" | "patch") {
            return Ok(());
        }
        let Some(policy) = self.current() else {
            return Err("the RBAC policy is not loaded yet".into());
        };
        let namespace = if attrs.resource.namespaced { attrs.namespace } else { "" };
        let owned = policy.rules_for(user, namespace);
        let may = |verb: &str, resource: &str, name: &str| {
            policy.allows(
                user,
                &Action::Resource { verb, group: resources::RBAC, resource, subresource: "", namespace, name },
            )
        };
        match kind {
            Kind::Role | Kind::ClusterRole => {
                if may("escalate", attrs.resource.plural, attrs.name) {
                    return Ok(());
                }
                if obj.get("aggregationRule").is_some_and(|a| !a.is_null()) {
                    return Err(format!(
                        "user \"{}\" must have cluster-admin privileges to use an aggregationRule",
                        user.name
                    ));
                }
                let rules: Vec<Rule> = obj["rules"].as_array().into_iter().flatten().map(Rule::from_json).collect();
                let missing: Vec<Rule> = rules.into_iter().filter(|r| !covers(&owned, r)).collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(escalation(user, namespace, &missing))
                }
            }
            _ => {
                let role_kind = obj["roleRef"]["kind"].as_str().unwrap_or_default();
                let role_name = obj["roleRef"]["name"].as_str().unwrap_or_default();
                let plural = if role_kind == "Role" { "roles" } else { "clusterroles" };
                if may("bind", plural, role_name) {
                    return Ok(());
                }
                let Some(rules) = policy.role_rules(role_kind, namespace, role_name) else {
                    return Err(format!("{plural}.{} \"{role_name}\" not found", resources::RBAC));
                };
                let missing: Vec<Rule> = rules.iter().filter(|r| !covers(&owned, r)).cloned().collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(escalation(user, namespace, &missing))
                }
            }
        }
    }
}

/// Kubernetes' wording, which kubectl prints as is.
fn escalation(user: &UserInfo, namespace: &str, missing: &[Rule]) -> String {
    let rules: Vec<String> = missing.iter().map(|r| r.to_json().to_string()).collect();
    let scope = if namespace.is_empty() { String::new() } else { format!(" in namespace \"{namespace}\"") };
    format!(
        "user \"{}\" (groups={:?}) is attempting to grant RBAC permissions not currently held{scope}: {}",
        user.name,
        user.groups,
        rules.join(", ")
    )
}
