use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStatus, DeploymentStrategy, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
    RollingUpdateDeployment,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as ApiSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use super::simulation::{str_at, Bounds, World};
use super::status::{self, condition};
use super::template::{self, DESIRED_REPLICAS, MAX_REPLICAS, POD_TEMPLATE_HASH, REVISION};
use super::*;
use crate::pod_state::tests::at;
use crate::replicaset::tests::{labels, template};

fn deployment(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("d-uid".into()),
            generation: Some(1),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: ApiSelector { match_labels: Some(labels(&[("app", "web")])), ..Default::default() },
            template: template("web", "nginx:1"),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(surge),
                    max_unavailable: Some(unavailable),
                }),
            }),
            revision_history_limit: Some(10),
            progress_deadline_seconds: Some(600),
            ..Default::default()
        }),
        status: None,
    }
}

fn percent(s: &str) -> IntOrString {
    IntOrString::String(s.into())
}

fn recreate(replicas: i32) -> Deployment {
    let mut d = deployment(replicas, IntOrString::Int(0), IntOrString::Int(0));
    d.spec.as_mut().unwrap().strategy =
        Some(DeploymentStrategy { type_: Some("Recreate".into()), rolling_update: None });
    d
}

fn set_image(world: &mut World, image: &str) {
    let image = image.to_string();
    world.edit(|s| s.template.spec.as_mut().unwrap().containers[0].image = Some(image));
}

/// A world whose Deployment has rolled out its first template.
fn settled(d: Deployment) -> World {
    let mut world = World::new(d, at(0));
    world.must_settle(200, World::rolled_out);
    world
}

/// An owned ReplicaSet of the Deployment, as the tests below need it.
fn owned_set(d: &Deployment, name: &str, image: &str, replicas: i32, revision: i64, created: i64) -> Arc<ReplicaSet> {
    let mut t = template("web", image);
    t.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert(POD_TEMPLATE_HASH.into(), name.into());
    let mut annotations = BTreeMap::new();
    annotations.insert(REVISION.to_string(), revision.to_string());
    Arc::new(ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("web-{name}")),
            namespace: Some("ns".into()),
            uid: Some(format!("rs-{name}")),
            labels: Some(labels(&[("app", "web"), (POD_TEMPLATE_HASH, name)])),
            annotations: Some(annotations),
            owner_references: Some(vec![ownership::controller_ref("apps/v1", "Deployment", &d.metadata)]),
            creation_timestamp: Some(Time(at(created))),
            resource_version: Some("5".into()),
            generation: Some(1),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: ApiSelector {
                match_labels: Some(labels(&[("app", "web"), (POD_TEMPLATE_HASH, name)])),
                ..Default::default()
            },
            template: Some(t),
            min_ready_seconds: None,
        }),
        status: Some(ReplicaSetStatus {
            replicas,
            ready_replicas: Some(replicas),
            available_replicas: Some(replicas),
            observed_generation: Some(1),
            ..Default::default()
        }),
    })
}

fn updates(r: &Reconciled) -> Vec<(String, i64, serde_json::Value)> {
    r.actions
        .iter()
        .filter_map(|a| match a {
            Action::Update(obj) => Some((
                str_at(obj, "/metadata/name").to_string(),
                obj["spec"]["replicas"].as_i64().unwrap_or(-1),
                obj["metadata"]["annotations"].clone(),
            )),
            _ => None,
        })
        .collect()
}

fn new_status(r: &Reconciled) -> DeploymentStatus {
    r.actions
        .iter()
        .find_map(|a| match a {
            Action::UpdateStatus(obj) => serde_json::from_value(obj["status"].clone()).ok(),
            _ => None,
        })
        .expect("a status update")
}

#[test]
fn fenceposts_round_surge_up_and_unavailability_down() {
    let d = deployment(10, percent("25%"), percent("25%"));
    let plan = Plan::new(&d, at(0));
    assert_eq!(plan.fenceposts(), (3, 2));
    let d = deployment(3, IntOrString::Int(0), percent("10%"));
    assert_eq!(Plan::new(&d, at(0)).fenceposts(), (0, 1), "both zero: one may be unavailable");
    assert_eq!(Plan::new(&recreate(3), at(0)).fenceposts(), (0, 0));
}

#[test]
fn a_new_deployment_creates_a_replica_set_named_by_its_template_hash() {
    let d = deployment(3, percent("25%"), percent("25%"));
    let r = reconcile(&d, &[], &[], at(0));
    let Some(Action::Create(rs)) = r.actions.iter().find(|a| matches!(a, Action::Create(_))) else {
        panic!("no replica set created: {:?}", r.actions)
    };
    let hash = template::pod_template_hash(&d.spec.as_ref().unwrap().template, None);
    assert_eq!(str_at(rs, "/metadata/name"), format!("web-{hash}"));
    assert_eq!(rs["spec"]["replicas"], 3);
    assert_eq!(rs["spec"]["selector"]["matchLabels"], json!({"app": "web", POD_TEMPLATE_HASH: hash}));
    assert_eq!(rs["spec"]["template"]["metadata"]["labels"][POD_TEMPLATE_HASH], json!(hash));
    assert_eq!(rs["metadata"]["annotations"][REVISION], "1");
    assert_eq!(rs["metadata"]["annotations"][DESIRED_REPLICAS], "3");
    assert_eq!(rs["metadata"]["annotations"][MAX_REPLICAS], "4");
    assert_eq!(rs["metadata"]["ownerReferences"][0]["uid"], "d-uid");
    let progressing = condition(&new_status(&r), status::PROGRESSING).cloned().expect("Progressing");
    assert_eq!(progressing.reason.as_deref(), Some(status::NEW_RS_CREATED));
    assert!(r
        .actions
        .iter()
        .any(|a| matches!(a, Action::Patch { patch, .. } if patch["metadata"]["annotations"][REVISION] == "1")));
}

#[test]
fn a_rolling_update_stays_within_surge_and_unavailability_throughout() {
    let cases = [
        (10, percent("25%"), percent("25%")),
        (10, IntOrString::Int(0), IntOrString::Int(1)),
        (10, IntOrString::Int(1), IntOrString::Int(0)),
        (5, percent("50%"), percent("0%")),
        (7, percent("30%"), percent("30%")),
        (1, IntOrString::Int(0), IntOrString::Int(1)),
    ];
    for (replicas, surge, unavailable) in cases {
        let d = deployment(replicas, surge.clone(), unavailable.clone());
        let mut world = settled(d);
        let (max_surge, max_unavailable) = Plan::new(&world.deployment, at(0)).fenceposts();
        let max_unavailable = max_unavailable.min(replicas);
        let bounds =
            Bounds { max_pods: (replicas + max_surge) as usize, min_available: (replicas - max_unavailable) as usize };
        world.bounds = Some(bounds);
        set_image(&mut world, "nginx:2");
        world.must_settle(400, World::rolled_out);
        let case = format!("{replicas} replicas, surge {surge:?}, unavailable {unavailable:?}");
        assert!(world.max_pods_seen <= bounds.max_pods, "{case}");
        assert!(world.min_available_seen >= bounds.min_available, "{case}");
        if bounds.max_pods > 1 {
            assert!(world.templates_overlapped, "{case}: a rolling update runs both templates for a while");
        }
        let sizes: Vec<i32> = world.summary().iter().map(|s| s.1).collect();
        assert_eq!(sizes.iter().sum::<i32>(), replicas, "{case}: {:?}", world.summary());
        assert_eq!(world.sets.len(), 2, "{case}");
        let new = world.created_sets.last().unwrap().clone();
        assert_eq!(world.set(&new).spec.as_ref().unwrap().replicas, Some(replicas), "{case}");
        assert_eq!(template::revision(world.set(&new)), 2, "{case}");
        let status = world.deployment.status.clone().unwrap();
        let progressing = condition(&status, status::PROGRESSING).unwrap();
        assert_eq!(progressing.reason.as_deref(), Some(status::NEW_RS_AVAILABLE), "{case}");
        assert_eq!(condition(&status, status::AVAILABLE).unwrap().status, "True");
        assert_eq!(world.deployment.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    }
}

#[test]
fn a_rolling_update_stays_within_bounds_when_replica_set_status_lags() {
    for period in [2, 3] {
        let mut world = settled(deployment(10, percent("25%"), percent("25%")));
        world.rs_period = period;
        world.bounds = Some(Bounds { max_pods: 13, min_available: 8 });
        set_image(&mut world, "nginx:2");
        world.must_settle(600, World::rolled_out);
        assert!(world.max_pods_seen <= 13 && world.min_available_seen >= 8, "period {period}");
    }
}

#[test]
fn recreate_removes_every_old_pod_before_the_new_replica_set_exists() {
    let mut world = settled(recreate(4));
    assert!(!world.templates_overlapped);
    world.bounds = Some(Bounds { max_pods: 4, min_available: 0 });
    set_image(&mut world, "nginx:2");
    let mut saw_empty = false;
    for _ in 0..100 {
        world.step();
        if world.created_sets.len() == 1 {
            // The new ReplicaSet must not exist while an old pod is left.
            saw_empty |= world.pods.is_empty();
        } else {
            assert!(saw_empty, "the new replica set was created while old pods ran");
        }
        if world.rolled_out() && world.created_sets.len() == 2 {
            break;
        }
    }
    assert!(world.rolled_out());
    assert!(!world.templates_overlapped, "old and new pods ran together");
    let old = world.created_sets[0].clone();
    assert_eq!(world.set(&old).spec.as_ref().unwrap().replicas, Some(0));
}

#[test]
fn a_rollback_reuses_the_old_replica_set_with_a_new_revision() {
    let mut world = settled(deployment(3, percent("25%"), percent("25%")));
    let first = world.created_sets[0].clone();
    set_image(&mut world, "nginx:2");
    world.must_settle(200, World::rolled_out);
    assert_eq!(world.created_sets.len(), 2);
    // `kubectl rollout undo` copies the old ReplicaSet's template back.
    set_image(&mut world, "nginx:1");
    world.must_settle(200, World::rolled_out);
    assert_eq!(world.created_sets.len(), 2, "no third replica set: {:?}", world.created_sets);
    assert_eq!(world.set(&first).spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(template::revision(world.set(&first)), 3);
    assert_eq!(world.deployment.metadata.annotations.as_ref().unwrap()[REVISION], "3");
}

#[test]
fn a_restart_annotation_rolls_out_like_any_template_change() {
    let mut world = settled(deployment(4, percent("25%"), percent("25%")));
    world.bounds = Some(Bounds { max_pods: 5, min_available: 3 });
    world.edit(|s| {
        s.template
            .metadata
            .as_mut()
            .unwrap()
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert("kubectl.kubernetes.io/restartedAt".into(), "2026-01-01T00:00:00Z".into());
    });
    world.must_settle(200, World::rolled_out);
    assert_eq!(world.created_sets.len(), 2);
    let new = world.created_sets[1].clone();
    assert!(world
        .pods
        .iter()
        .all(|p| { p.metadata.labels.as_ref().unwrap()[POD_TEMPLATE_HASH] == new.trim_start_matches("web-") }));
}

#[test]
fn a_paused_deployment_does_not_roll_out_until_resumed() {
    let mut world = settled(deployment(3, percent("25%"), percent("25%")));
    world.edit(|s| s.paused = Some(true));
    set_image(&mut world, "nginx:2");
    for _ in 0..20 {
        world.step();
    }
    assert_eq!(world.created_sets.len(), 1, "a paused deployment created a replica set");
    let status = world.deployment.status.clone().unwrap();
    let progressing = condition(&status, status::PROGRESSING).unwrap();
    assert_eq!((progressing.status.as_str(), progressing.reason.as_deref()), ("Unknown", Some(status::PAUSED)));
    // Scaling still works while paused.
    world.edit(|s| s.replicas = Some(5));
    world.must_settle(50, |w| w.pods.len() == 5);
    assert_eq!(world.created_sets.len(), 1);

    world.edit(|s| s.paused = None);
    world.must_settle(200, World::rolled_out);
    assert_eq!(world.created_sets.len(), 2);
}

#[test]
fn resuming_says_so_in_the_progressing_condition() {
    let mut d = deployment(1, percent("25%"), percent("25%"));
    d.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(1),
        updated_replicas: Some(1),
        conditions: Some(vec![status::condition_of(
            status::PROGRESSING,
            "Unknown",
            status::PAUSED,
            "Deployment is paused",
            at(0),
        )]),
        ..Default::default()
    });
    // One pod, not yet available: the rollout has not moved since the pause.
    let mut rs = (*owned_set(&d, "a", "nginx:1", 1, 1, 0)).clone();
    rs.status = Some(ReplicaSetStatus { replicas: 1, observed_generation: Some(1), ..Default::default() });
    let r = reconcile(&d, &[Arc::new(rs)], &[], at(5));
    let progressing = condition(&new_status(&r), status::PROGRESSING).cloned().unwrap();
    assert_eq!(progressing.reason.as_deref(), Some(status::RESUMED));
}

#[test]
fn scaling_mid_rollout_is_shared_in_proportion() {
    let mut d = deployment(20, percent("25%"), percent("25%"));
    d.spec.as_mut().unwrap().template = template("web", "nginx:2");
    let annotate = |rs: Arc<ReplicaSet>| {
        let mut rs = (*rs).clone();
        let a = rs.metadata.annotations.as_mut().unwrap();
        a.insert(DESIRED_REPLICAS.into(), "10".into());
        a.insert(MAX_REPLICAS.into(), "13".into());
        Arc::new(rs)
    };
    let old = annotate(owned_set(&d, "old", "nginx:1", 8, 1, 0));
    let new = annotate(owned_set(&d, "new", "nginx:2", 5, 2, 10));
    let r = reconcile(&d, &[old, new], &[], at(100));
    let mut got: Vec<(String, i64)> = updates(&r).into_iter().map(|(n, s, _)| (n, s)).collect();
    got.sort();
    assert_eq!(got, [("web-new".to_string(), 10), ("web-old".to_string(), 15)]);
    for (_, _, annotations) in updates(&r) {
        assert_eq!(annotations[DESIRED_REPLICAS], "20");
        assert_eq!(annotations[MAX_REPLICAS], "25");
    }
}

#[test]
fn scaling_down_mid_rollout_is_shared_in_proportion_too() {
    let mut world = settled(deployment(10, percent("25%"), percent("25%")));
    world.ready_after = 1_000;
    set_image(&mut world, "nginx:2");
    for _ in 0..5 {
        world.step();
    }
    let before: i32 = world.sets.iter().map(|rs| rs.spec.as_ref().unwrap().replicas.unwrap()).sum();
    assert_eq!(before, 13, "{:?}", world.summary());
    world.edit(|s| s.replicas = Some(5));
    world.reconcile_deployment();
    let sizes: Vec<i32> = world.sets.iter().map(|rs| rs.spec.as_ref().unwrap().replicas.unwrap()).collect();
    // 5 + 25% surge (2) = 7, shared out by the old sizes (8 and 5 of 13).
    assert_eq!(sizes.iter().sum::<i32>(), 7, "{:?}", world.summary());
    assert!(sizes.iter().all(|s| *s > 0), "{:?}", world.summary());
    world.ready_after = 3;
    world.must_settle(200, World::rolled_out);
}

#[test]
fn old_replica_sets_beyond_the_history_limit_are_deleted_oldest_first() {
    let mut d = deployment(2, percent("25%"), percent("25%"));
    d.spec.as_mut().unwrap().revision_history_limit = Some(2);
    d.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(2),
        updated_replicas: Some(2),
        available_replicas: Some(2),
        ..Default::default()
    });
    let mut sets: Vec<Arc<ReplicaSet>> =
        (1..=4).map(|i| owned_set(&d, &format!("v{i}"), &format!("nginx:0.{i}"), 0, i, i)).collect();
    sets.push(owned_set(&d, "cur", "nginx:1", 2, 5, 10));
    let r = reconcile(&d, &sets, &[], at(100));
    let deleted: Vec<&str> = r
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { name, kind, .. } if kind == "ReplicaSet" => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["web-v1", "web-v2"]);
}

#[test]
fn a_rollout_without_progress_times_out_after_the_deadline() {
    let mut d = deployment(3, percent("25%"), percent("25%"));
    d.spec.as_mut().unwrap().template = template("web", "nginx:2");
    let stuck = DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(4),
        updated_replicas: Some(1),
        ready_replicas: Some(3),
        available_replicas: Some(3),
        unavailable_replicas: Some(1),
        conditions: Some(vec![
            status::condition_of(status::PROGRESSING, "True", status::RS_UPDATED, "x", at(0)),
            status::condition_of(
                status::AVAILABLE,
                "True",
                status::MINIMUM_REPLICAS_AVAILABLE,
                "Deployment has minimum availability.",
                at(0),
            ),
        ]),
        ..Default::default()
    };
    d.status = Some(stuck);
    let old = owned_set(&d, "old", "nginx:1", 3, 1, 0);
    let mut new = (*owned_set(&d, "new", "nginx:2", 1, 2, 1)).clone();
    new.status = Some(ReplicaSetStatus { replicas: 1, observed_generation: Some(1), ..Default::default() });
    let a = new.metadata.annotations.as_mut().unwrap();
    a.insert(DESIRED_REPLICAS.into(), "3".into());
    a.insert(MAX_REPLICAS.into(), "4".into());
    let mut old = (*old).clone();
    let a = old.metadata.annotations.as_mut().unwrap();
    a.insert(DESIRED_REPLICAS.into(), "3".into());
    a.insert(MAX_REPLICAS.into(), "4".into());
    let sets = [Arc::new(old), Arc::new(new)];

    let early = reconcile(&d, &sets, &[], at(300));
    assert!(early.actions.iter().all(|a| !matches!(a, Action::UpdateStatus(_))), "{:?}", early.actions);
    assert_eq!(early.requeue_after, Some(std::time::Duration::from_secs(301)));

    let late = reconcile(&d, &sets, &[], at(601));
    let progressing = condition(&new_status(&late), status::PROGRESSING).cloned().unwrap();
    assert_eq!(progressing.status, "False");
    assert_eq!(progressing.reason.as_deref(), Some(status::TIMED_OUT));
    assert_eq!(progressing.message.as_deref(), Some("ReplicaSet \"web-new\" has timed out progressing."));
}

#[test]
fn availability_below_the_minimum_is_reported() {
    let d = deployment(4, IntOrString::Int(1), IntOrString::Int(1));
    let mut rs = (*owned_set(&d, "a", "nginx:1", 4, 1, 0)).clone();
    rs.spec.as_mut().unwrap().template = Some(d.spec.as_ref().unwrap().template.clone());
    rs.status.as_mut().unwrap().available_replicas = Some(2);
    let r = reconcile(&d, &[Arc::new(rs)], &[], at(0));
    let s = new_status(&r);
    let available = condition(&s, status::AVAILABLE).unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_deref()),
        ("False", Some(status::MINIMUM_REPLICAS_UNAVAILABLE))
    );
    assert_eq!(s.unavailable_replicas, Some(2));
}

#[test]
fn a_replica_set_failure_is_repeated_on_the_deployment() {
    let d = deployment(2, percent("25%"), percent("25%"));
    let mut rs = (*owned_set(&d, "a", "nginx:1", 2, 1, 0)).clone();
    rs.spec.as_mut().unwrap().template = Some(d.spec.as_ref().unwrap().template.clone());
    let status = rs.status.as_mut().unwrap();
    status.available_replicas = Some(0);
    status.conditions = Some(vec![k8s_openapi::api::apps::v1::ReplicaSetCondition {
        type_: "ReplicaFailure".into(),
        status: "True".into(),
        reason: Some("FailedCreate".into()),
        message: Some("exceeded quota".into()),
        last_transition_time: None,
    }]);
    let r = reconcile(&d, &[Arc::new(rs)], &[], at(0));
    let s = new_status(&r);
    let failure = condition(&s, status::REPLICA_FAILURE).expect("ReplicaFailure");
    assert_eq!((failure.reason.as_deref(), failure.message.as_deref()), (Some("FailedCreate"), Some("exceeded quota")));
}

#[test]
fn a_hash_collision_counts_up_and_creates_nothing() {
    let d = deployment(2, percent("25%"), percent("25%"));
    let hash = template::pod_template_hash(&d.spec.as_ref().unwrap().template, None);
    let mut squatter = (*owned_set(&d, "x", "busybox", 0, 1, 0)).clone();
    squatter.metadata.name = Some(format!("web-{hash}"));
    squatter.metadata.owner_references = None;
    squatter.metadata.labels = Some(labels(&[("other", "thing")]));
    let r = reconcile(&d, &[Arc::new(squatter)], &[], at(0));
    assert!(r.actions.iter().all(|a| !matches!(a, Action::Create(_))));
    assert_eq!(new_status(&r).collision_count, Some(1));
    let mut counted = d.clone();
    counted.status = Some(DeploymentStatus { collision_count: Some(1), ..Default::default() });
    let retry = reconcile(&counted, &[], &[], at(1));
    let Some(Action::Create(rs)) = retry.actions.iter().find(|a| matches!(a, Action::Create(_))) else {
        panic!("created")
    };
    assert_ne!(str_at(rs, "/metadata/name"), format!("web-{hash}"));
}

#[test]
fn orphan_replica_sets_matching_the_selector_are_adopted() {
    let d = deployment(2, percent("25%"), percent("25%"));
    let mut orphan = (*owned_set(&d, "o", "nginx:1", 2, 1, 0)).clone();
    orphan.metadata.owner_references = None;
    let r = reconcile(&d, &[Arc::new(orphan)], &[], at(0));
    let Action::Patch { name, patch, .. } = &r.actions[0] else { panic!("adoption first: {:?}", r.actions) };
    assert_eq!(name, "web-o");
    assert_eq!(patch["metadata"]["ownerReferences"][0]["kind"], "Deployment");
}

#[test]
fn a_finished_rollout_reports_what_kubectl_rollout_status_waits_for() {
    let world = settled(deployment(3, percent("25%"), percent("25%")));
    let s = world.deployment.status.clone().unwrap();
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(
        (s.replicas, s.updated_replicas, s.ready_replicas, s.available_replicas),
        (Some(3), Some(3), Some(3), Some(3))
    );
    assert_eq!(s.unavailable_replicas, None);
}
