//! `pods/eviction`: a delete that respects PodDisruptionBudgets, as
//! Kubernetes' `EvictionREST` does it (`kubectl drain` evicts through it).
//!
//! A pod that has already stopped counting (not Running: Pending,
//! Succeeded, Failed; or already being deleted) is deleted at once. Else
//! the budget whose selector matches the pod decides: more than one is a
//! 500, as in Kubernetes; none lets the delete through. A pod that is not
//! Ready goes without charging the budget when the budget is met anyway
//! (or its `unhealthyPodEvictionPolicy` is `AlwaysAllow`). Otherwise the
//! budget is charged in its status, by compare-and-swap: one disruption
//! fewer allowed and the pod recorded in `disruptedPods`, so the
//! disruption controller stops counting it as healthy before it is gone.
//! A budget with no disruption left, or whose status is older than its
//! spec, is a 429 that clients retry. Only then is the pod deleted, with
//! the eviction's delete options and, for a pod that is not Ready, a
//! precondition on the version that was judged.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use skiff_api::status::{Cause, Details};
use skiff_api::{meta, ApiError, Reason};

use skiff_api::resources::{self, Kind};
use skiff_api::selector::LabelSelector;

use super::{Context, DeleteOptions, Record, Registry};
use crate::admission::Attributes;
use crate::storage::{prefix_end, Consistency};

/// Kubernetes' `MaxDisruptedPodSize`: evictions the controller has not
/// confirmed yet, beyond which a budget takes no more.
const MAX_DISRUPTED_PODS: usize = 2000;

/// The `details.causes[].reason` of a refusal by a budget.
const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// Whether the pod no longer counts toward any budget, so evicting it
/// disrupts nothing (Kubernetes' `canIgnorePDB`).
pub(crate) fn can_ignore_budgets(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed" | "Pending"))
        || meta::deletion_timestamp(pod).is_some()
}

/// A pod's `Ready` condition is `True`.
pub(crate) fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Whether `budget` selects `pod` (same namespace assumed): in `policy/v1`
/// a missing selector selects nothing and an empty one every pod.
pub(crate) fn selects(budget: &Value, pod: &Value) -> bool {
    let selector = &budget["spec"]["selector"];
    if selector.is_null() {
        return false;
    }
    LabelSelector::from_api(selector).is_ok_and(|s| s.matches(&meta::labels(pod)))
}

/// A pod that is not Ready may go without charging `budget`: always under
/// `AlwaysAllow`, else while the budget has all the healthy pods it wants.
pub(crate) fn unhealthy_may_go(pod: &Value, budget: &Value) -> bool {
    if is_ready(pod) {
        return false;
    }
    if budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow" {
        return true;
    }
    let status = &budget["status"];
    let (current, desired) = (status["currentHealthy"].as_i64().unwrap_or(0), status["desiredHealthy"].as_i64());
    desired.is_some_and(|d| d > 0 && current >= d)
}

fn too_many_requests(message: String, retry_after: Option<u32>) -> ApiError {
    ApiError {
        reason: Reason::TooManyRequests,
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        details: Some(Box::new(Details {
            causes: vec![Cause { kind: DISRUPTION_BUDGET_CAUSE.into(), message, field: String::new() }],
            retry_after_seconds: retry_after,
            ..Default::default()
        })),
    }
}

fn forbidden(budget: &str, why: &str) -> ApiError {
    ApiError::forbidden(format!("poddisruptionbudgets.policy \"{budget}\" is forbidden: {why}"))
}

/// `budget` charged with the eviction of `pod` at `now` (Kubernetes'
/// `checkAndDecrement`), or why it may not be. A dry run changes only the
/// count, not `disruptedPods`.
pub(crate) fn charge(budget: &Value, pod: &str, dry_run: bool, now: DateTime<Utc>) -> Result<Value, ApiError> {
    let name = meta::name(budget).unwrap_or_default();
    let status = &budget["status"];
    if status["observedGeneration"].as_i64().unwrap_or(0) < meta::generation(budget) {
        return Err(too_many_requests(
            format!("The disruption budget {name} is still being processed by the server."),
            Some(10),
        ));
    }
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed < 0 {
        return Err(forbidden(name, "pdb disruptions allowed is negative"));
    }
    if status["disruptedPods"].as_object().is_some_and(|m| m.len() > MAX_DISRUPTED_PODS) {
        return Err(forbidden(name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller"));
    }
    if allowed == 0 {
        let (desired, current) =
            (status["desiredHealthy"].as_i64().unwrap_or(0), status["currentHealthy"].as_i64().unwrap_or(0));
        return Err(too_many_requests(
            format!("The disruption budget {name} needs {desired} healthy pods and has {current} currently"),
            None,
        ));
    }
    let mut next = budget.clone();
    next["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if allowed == 1 {
        set_disruption_allowed(&mut next["status"], false, now);
    }
    if !dry_run {
        let stamp = now.to_rfc3339_opts(SecondsFormat::Secs, true);
        if !next["status"]["disruptedPods"].is_object() {
            next["status"]["disruptedPods"] = json!({});
        }
        next["status"]["disruptedPods"][pod] = json!(stamp);
    }
    Ok(next)
}

/// Sets a budget status's `DisruptionAllowed` condition (Kubernetes'
/// `UpdateDisruptionAllowedCondition`), keeping its transition time when
/// the status does not change. Shared with the disruption controller's
/// rules, which the controller crate restates for typed objects.
pub(crate) fn set_disruption_allowed(status: &mut Value, allowed: bool, now: DateTime<Utc>) {
    let (state, reason) = if allowed { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
    let stamp = now.to_rfc3339_opts(SecondsFormat::Secs, true);
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let conditions = status["conditions"].as_array_mut().expect("made an array above");
    match conditions.iter_mut().find(|c| c["type"] == "DisruptionAllowed") {
        Some(c) => {
            if c["status"] != state {
                c["lastTransitionTime"] = json!(stamp);
            }
            c["status"] = json!(state);
            c["reason"] = json!(reason);
        }
        None => conditions.push(json!({
            "type": "DisruptionAllowed", "status": state, "reason": reason, "message": "", "lastTransitionTime": stamp,
        })),
    }
}

/// The pod with the `DisruptionTarget` condition an eviction adds, so its
/// controller and `kubectl describe` can tell why it went; None when it
/// has one already.
pub(crate) fn with_disruption_target(pod: &Value, now: DateTime<Utc>) -> Option<Value> {
    let conditions = pod["status"]["conditions"].as_array();
    if conditions.is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget" && c["status"] == "True")) {
        return None;
    }
    let mut next = pod.clone();
    let condition = json!({
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastTransitionTime": now.to_rfc3339_opts(SecondsFormat::Secs, true),
    });
    let list = &mut next["status"]["conditions"];
    match list.as_array_mut() {
        Some(list) => {
            list.retain(|c| c["type"] != "DisruptionTarget");
            list.push(condition);
        }
        None => *list = json!([condition]),
    }
    Some(next)
}

/// The delete options an Eviction carries, checked against the name in the
/// URL; `dry_run` from the query adds to the body's.
pub(crate) fn delete_options(name: &str, eviction: &Value, dry_run: bool) -> Result<DeleteOptions, ApiError> {
    if !eviction.is_object() {
        return Err(ApiError::bad_request("the body of an eviction must be a policy/v1 Eviction object"));
    }
    let named = meta::name(eviction).unwrap_or_default();
    if named != name {
        return Err(ApiError::bad_request("name in URL does not match name in Eviction object"));
    }
    let mut opts = DeleteOptions::from_body(&eviction["deleteOptions"]);
    opts.dry_run |= dry_run;
    Ok(opts)
}

impl Registry {
    /// `pods/eviction` (see the module documentation).
    pub async fn evict(
        &self,
        ctx: &Context,
        namespace: &str,
        name: &str,
        eviction: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let pods = resources::of(Kind::Pod);
        let ns = self.scope(pods, namespace)?.unwrap_or_default();
        self.authorize(ctx, "create", pods, "eviction", ns, name)?;
        let mut opts = delete_options(name, eviction, dry_run)?;
        // Judge the latest pod and budgets, not this member's possibly
        // trailing copy.
        self.refresh().await?;
        let stored = self.current(pods, Some(ns), name).await?.ok_or_else(|| ApiError::not_found(pods, name))?;
        let pod = stored.decode()?;
        let judged_version = stored.mod_revision;
        // Admission (a node evicts only its own pods) before any budget is charged.
        let attrs = Attributes {
            user: &ctx.user,
            verb: "create",
            resource: pods,
            subresource: "eviction",
            namespace: ns,
            name,
        };
        self.security.admit(&attrs, &mut eviction.clone(), Some(&pod))?;
        // The delete's preconditions, checked before a budget is charged
        // for a delete that would fail on them.
        opts.check(pods, &pod, judged_version)?;
        let ignore = can_ignore_budgets(&pod);
        if !ignore {
            let budgets = self.budgets_selecting(ns, &pod).await?;
            match budgets.as_slice() {
                [] => {}
                [budget] if unhealthy_may_go(&pod, budget) => {}
                [budget] => self.charge_budget(ctx, ns, budget, name, opts.dry_run).await?,
                _ => return Err(ApiError::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )),
            }
        }
        // A pod that did not count as healthy must not have become so in
        // between; a terminal one must still be the one judged.
        if (ignore || !is_ready(&pod)) && opts.resource_version.is_none() {
            opts.resource_version = Some(judged_version.to_string());
        }
        if opts.dry_run {
            return self.delete_unchecked(ctx, pods, ns, name, &opts).await.map(|_| success());
        }
        if !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
            let precondition = opts.resource_version.as_deref().and_then(|rv| rv.parse().ok());
            let now = Utc::now();
            let marked = self
                .read_modify_write(
                    ctx,
                    pods,
                    Some(ns),
                    name,
                    precondition,
                    false,
                    "update",
                    "status",
                    Record::Skip,
                    |p| Ok(with_disruption_target(p, now).unwrap_or_else(|| p.clone())),
                )
                .await?;
            if opts.resource_version.is_some() {
                opts.resource_version = meta::resource_version(&marked).map(str::to_string);
            }
        }
        self.delete_unchecked(ctx, pods, ns, name, &opts).await?;
        Ok(success())
    }

    /// The PodDisruptionBudgets of `namespace` that select `pod`.
    async fn budgets_selecting(&self, namespace: &str, pod: &Value) -> Result<Vec<Value>, ApiError> {
        let prefix = resources::of(Kind::PodDisruptionBudget).namespace_prefix(Some(namespace));
        let revision = self.objects.prepare_read(Consistency::Any).await?;
        let page = self.objects.range_small(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), revision)?;
        let mut found = Vec::new();
        for item in &page.items {
            let budget = item.decode()?;
            if selects(&budget, pod) {
                found.push(budget);
            }
        }
        Ok(found)
    }

    /// Charges `budget` with evicting `pod`, retrying on a concurrent
    /// writer with the budget as it is then.
    async fn charge_budget(
        &self,
        ctx: &Context,
        namespace: &str,
        budget: &Value,
        pod: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let info = resources::of(Kind::PodDisruptionBudget);
        let name = meta::name(budget).unwrap_or_default();
        let now = Utc::now();
        self.read_modify_write(
            ctx,
            info,
            Some(namespace),
            name,
            None,
            dry_run,
            "update",
            "status",
            Record::Skip,
            |b| charge(b, pod, dry_run, now),
        )
        .await?;
        Ok(())
    }
}

/// What a successful eviction answers (201).
fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-12-05T04:00:00Z".parse().unwrap()
    }

    fn pod(phase: &str, ready: bool) -> Value {
        json!({
            "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        })
    }

    fn budget(allowed: i64, current: i64, desired: i64) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 2},
            "spec": {"minAvailable": desired, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"observedGeneration": 2, "disruptionsAllowed": allowed, "currentHealthy": current,
                       "desiredHealthy": desired, "expectedPods": current},
        })
    }

    #[test]
    fn pods_that_no_longer_count_are_deleted_without_a_budget() {
        for phase in ["Pending", "Succeeded", "Failed"] {
            assert!(can_ignore_budgets(&pod(phase, false)), "{phase}");
        }
        assert!(!can_ignore_budgets(&pod("Running", true)));
        let mut going = pod("Running", true);
        going["metadata"]["deletionTimestamp"] = json!("2026-12-05T04:00:00Z");
        assert!(can_ignore_budgets(&going));
    }

    #[test]
    fn a_missing_selector_selects_nothing_and_an_empty_one_everything() {
        let mut b = budget(1, 2, 1);
        assert!(selects(&b, &pod("Running", true)));
        b["spec"]["selector"] = json!({"matchLabels": {"app": "api"}});
        assert!(!selects(&b, &pod("Running", true)));
        b["spec"]["selector"] = json!({});
        assert!(selects(&b, &pod("Running", true)));
        b["spec"].as_object_mut().unwrap().remove("selector");
        assert!(!selects(&b, &pod("Running", true)));
    }

    #[test]
    fn a_charge_takes_one_disruption_and_records_the_pod() {
        let charged = charge(&budget(2, 3, 1), "web-1", false, now()).unwrap();
        assert_eq!(charged["status"]["disruptionsAllowed"], 1);
        assert_eq!(charged["status"]["disruptedPods"]["web-1"], "2026-12-05T04:00:00Z");
        assert!(charged["status"]["conditions"].is_null(), "still allowed: the condition is the controller's");
        let last = charge(&budget(1, 2, 1), "web-1", false, now()).unwrap();
        assert_eq!(last["status"]["disruptionsAllowed"], 0);
        assert_eq!(last["status"]["conditions"][0]["status"], "False");
        assert_eq!(last["status"]["conditions"][0]["reason"], "InsufficientPods");
        let dry = charge(&budget(1, 2, 1), "web-1", true, now()).unwrap();
        assert!(dry["status"]["disruptedPods"].is_null());
    }

    #[test]
    fn a_spent_or_stale_budget_refuses_with_429_and_says_why() {
        let spent = charge(&budget(0, 2, 2), "web-1", false, now()).unwrap_err();
        assert_eq!(spent.code(), 429);
        assert_eq!(spent.message, "Cannot evict pod as it would violate the pod's disruption budget.");
        let cause = &spent.details.as_ref().unwrap().causes[0];
        assert_eq!(cause.kind, "DisruptionBudget");
        assert_eq!(cause.message, "The disruption budget web needs 2 healthy pods and has 2 currently");
        let mut stale = budget(3, 4, 1);
        stale["metadata"]["generation"] = json!(3);
        let stale = charge(&stale, "web-1", false, now()).unwrap_err();
        assert_eq!(stale.code(), 429);
        assert_eq!(stale.details.as_ref().unwrap().retry_after_seconds, Some(10));
        assert!(stale.details.unwrap().causes[0].message.contains("still being processed"));
        assert_eq!(charge(&budget(-1, 0, 1), "web-1", false, now()).unwrap_err().code(), 403);
    }

    #[test]
    fn an_unready_pod_goes_free_only_while_the_budget_is_met_or_always_allowed() {
        let unready = pod("Running", false);
        assert!(unhealthy_may_go(&unready, &budget(0, 2, 2)));
        assert!(!unhealthy_may_go(&unready, &budget(0, 1, 2)));
        assert!(!unhealthy_may_go(&pod("Running", true), &budget(0, 2, 2)));
        let mut always = budget(0, 0, 2);
        always["spec"]["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
        assert!(unhealthy_may_go(&unready, &always));
    }

    #[test]
    fn the_eviction_names_its_pod_and_carries_the_delete_options() {
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1"},
                              "deleteOptions": {"gracePeriodSeconds": 5, "preconditions": {"uid": "u1"}}});
        let opts = delete_options("web-1", &eviction, true).unwrap();
        assert_eq!((opts.grace_period_seconds, opts.uid.as_deref(), opts.dry_run), (Some(5), Some("u1"), true));
        let wrong = delete_options("web-2", &eviction, false).unwrap_err();
        assert_eq!((wrong.code(), wrong.message.as_str()), (400, "name in URL does not match name in Eviction object"));
    }

    #[test]
    fn preconditions_that_cannot_hold_refuse_before_a_budget_is_charged() {
        let pods = resources::of(Kind::Pod);
        let mut p = pod("Running", true);
        p["metadata"]["uid"] = json!("u1");
        let with = |uid: Option<&str>, rv: Option<&str>| DeleteOptions {
            uid: uid.map(str::to_string),
            resource_version: rv.map(str::to_string),
            ..Default::default()
        };
        assert!(with(Some("u1"), Some("7")).check(pods, &p, 7).is_ok());
        assert!(with(None, None).check(pods, &p, 7).is_ok());
        let uid = with(Some("u2"), None).check(pods, &p, 7).unwrap_err();
        assert_eq!(uid.code(), 409);
        assert!(uid.message.contains("UID in precondition: u2"), "{}", uid.message);
        assert_eq!(with(None, Some("6")).check(pods, &p, 7).unwrap_err().code(), 409);
        assert_eq!(with(None, Some("x")).check(pods, &p, 7).unwrap_err().code(), 400, "not a version");
    }

    #[test]
    fn the_disruption_target_condition_is_added_once() {
        let marked = with_disruption_target(&pod("Running", true), now()).unwrap();
        let conditions = marked["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1]["reason"], "EvictionByEvictionAPI");
        assert!(with_disruption_target(&marked, now()).is_none());
    }
}
