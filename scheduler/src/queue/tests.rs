//! The queue's rules, on paused tokio time.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn pod(name: &str, priority: i32) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..Default::default() },
        spec: Some(PodSpec { priority: Some(priority), ..Default::default() }),
        ..Default::default()
    })
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn queue() -> SchedulingQueue {
    SchedulingQueue::new(QueueConfig { capacity: 16, ..QueueConfig::default() })
}

/// Pops, failing the test if nothing is ready within `limit`.
async fn must_pop_within(q: &SchedulingQueue, limit: Duration) -> QueuedPod {
    match tokio::time::timeout(limit, q.pop()).await {
        Ok(Some(p)) => p,
        Ok(None) => panic!("the queue was shut down"),
        Err(_) => panic!("nothing popped within {limit:?}; lengths {:?}", q.lengths()),
    }
}

async fn nothing_within(q: &SchedulingQueue, limit: Duration) -> bool {
    tokio::time::timeout(limit, q.pop()).await.is_err()
}

const NOW: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn pods_pop_by_priority_then_by_how_long_they_have_waited() {
    let q = queue();
    q.add(pod("low-old", 0)).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    q.add(pod("high", 1000)).unwrap();
    q.add(pod("low-new", 0)).unwrap();
    q.add(pod("negative", -5)).unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(must_pop_within(&q, NOW).await.key.name);
    }
    assert_eq!(order, ["high", "low-old", "low-new", "negative"]);
    assert_eq!(q.lengths(), QueueLengths { in_flight: 4, ..QueueLengths::default() });
}

#[tokio::test(start_paused = true)]
async fn an_update_replaces_a_waiting_pod_in_place() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    q.add(pod("b", 0)).unwrap();
    let mut updated = (*pod("a", 0)).clone();
    updated.metadata.labels = Some(BTreeMap::from([("v".to_string(), "2".to_string())]));
    q.add(Arc::new(updated)).unwrap();
    assert_eq!(q.lengths().active, 2);
    let first = must_pop_within(&q, NOW).await;
    assert_eq!(first.key, key("a"), "the update kept its place ahead of b");
    assert_eq!(first.pod.metadata.labels.as_ref().and_then(|l| l.get("v")).map(String::as_str), Some("2"));
    assert_eq!(first.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn an_unschedulable_pod_whose_spec_changed_is_tried_again_at_once() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, Hint::default());
    assert_eq!(q.lengths().unschedulable, 1);
    // A status-only update changes nothing.
    let mut status_only = (*pod("a", 0)).clone();
    status_only.status = Some(Default::default());
    q.add(Arc::new(status_only)).unwrap();
    assert_eq!(q.lengths().unschedulable, 1);
    let mut respec = (*pod("a", 0)).clone();
    respec.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([("zone".into(), "b".into())]));
    q.add(Arc::new(respec)).unwrap();
    assert_eq!(q.lengths().active, 1);
    let again = must_pop_within(&q, NOW).await;
    assert!(again.pod.spec.as_ref().unwrap().node_selector.is_some());
    assert_eq!(again.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_deleted_pod_is_not_popped_nor_requeued() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    q.add(pod("b", 0)).unwrap();
    q.delete(&key("a"));
    let b = must_pop_within(&q, NOW).await;
    assert_eq!(b.key, key("b"));
    // Deleted while in flight: dropped when it comes back.
    q.delete(&key("b"));
    q.requeue_error(b);
    assert_eq!(q.lengths(), QueueLengths::default());
    assert!(nothing_within(&q, Duration::from_secs(3600)).await);
}

#[test]
fn the_backoff_doubles_per_attempt_up_to_the_cap() {
    let queues = Queues::new(QueueConfig::default());
    let backoffs: Vec<u64> = (1..=6).map(|a| queues.backoff_of(a).as_secs()).collect();
    assert_eq!(backoffs, [1, 2, 4, 8, 10, 10]);
    assert_eq!(queues.backoff_of(u32::MAX), Duration::from_secs(10));
    assert_eq!(queues.backoff_of(0), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_pod_waits_out_its_backoff_before_it_is_popped_again() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let mut a = must_pop_within(&q, NOW).await;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let failed = Instant::now();
        q.requeue_error(a);
        assert_eq!(q.lengths().backoff, 1);
        a = must_pop_within(&q, Duration::from_secs(60)).await;
        waits.push(failed.elapsed().as_secs());
    }
    assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
    assert_eq!(a.attempts, 7);
}

#[tokio::test(start_paused = true)]
async fn an_event_during_the_attempt_sends_an_unschedulable_pod_to_backoff_not_to_the_pool() {
    let q = queue();
    q.add(pod("before", 0)).unwrap();
    q.add(pod("during", 0)).unwrap();
    q.on_cluster_event(ClusterEvent::NodeAdded, None);
    // The event came before this attempt: the attempt saw its effect.
    let before = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(before, Hint::default());
    assert_eq!(q.lengths().unschedulable, 1);

    let during = must_pop_within(&q, NOW).await;
    q.on_cluster_event(ClusterEvent::PodDeleted, None);
    // The event moved "before" out of the pool; "during" lands in backoff.
    assert_eq!(q.lengths(), QueueLengths { backoff: 1, in_flight: 1, ..QueueLengths::default() });
    q.requeue_unschedulable(during, Hint::default());
    assert_eq!(q.lengths(), QueueLengths { backoff: 2, ..QueueLengths::default() });
}

#[tokio::test(start_paused = true)]
async fn a_cluster_event_moves_unschedulable_pods_to_active_once_their_backoff_passed() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, Hint::default());
    assert!(nothing_within(&q, Duration::from_secs(30)).await, "it waits for an event");
    q.on_cluster_event(ClusterEvent::NodeChanged, None);
    assert_eq!(q.lengths().active, 1, "its 1 s back-off ended long ago");
    let a = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, Hint::default());
    q.on_cluster_event(ClusterEvent::NodeAdded, None);
    assert_eq!(q.lengths().backoff, 1, "a fresh failure waits out its 2 s back-off");
    let started = Instant::now();
    must_pop_within(&q, Duration::from_secs(60)).await;
    assert_eq!(started.elapsed().as_secs(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unschedulable_pod_is_tried_again_after_max_in_unschedulable_without_an_event() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    let parked = Instant::now();
    q.requeue_unschedulable(a, Hint::default());
    let again = must_pop_within(&q, Duration::from_secs(3600)).await;
    assert_eq!(parked.elapsed(), Duration::from_secs(5 * 60));
    assert_eq!(again.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn shut_down_wakes_a_waiting_pop() {
    let q = queue();
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.pop().await.map(|p| p.key) }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.shut_down();
    assert_eq!(waiting.await.unwrap(), None);
    q.add(pod("late", 0)).unwrap();
    assert!(q.pop().await.is_none(), "a shut down queue hands out nothing");
}

#[tokio::test(start_paused = true)]
async fn an_add_wakes_a_waiting_pop() {
    let q = queue();
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.pop().await.map(|p| p.key) }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.add(pod("a", 0)).unwrap();
    assert_eq!(waiting.await.unwrap(), Some(key("a")));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_new_pods_but_takes_updates_and_requeues() {
    let q = SchedulingQueue::new(QueueConfig { capacity: 3, ..QueueConfig::default() });
    for name in ["a", "b", "c"] {
        q.add(pod(name, 0)).unwrap();
    }
    assert_eq!(q.add(pod("d", 0)), Err(QueueFull { key: key("d"), capacity: 3 }));
    q.add(pod("c", 0)).expect("an update of a queued pod is not a new pod");
    // A pod in flight still counts, and always finds its way back.
    let a = must_pop_within(&q, NOW).await;
    assert!(q.add(pod("d", 0)).is_err());
    q.requeue_error(a);
    assert_eq!(q.lengths().backoff, 1);
    let b = must_pop_within(&q, NOW).await;
    q.done(&b.key);
    q.add(pod("d", 0)).expect("room again once a pod is bound");
    assert_eq!(q.lengths(), QueueLengths { active: 2, backoff: 1, ..QueueLengths::default() });
}

#[tokio::test(start_paused = true)]
async fn a_pod_updated_in_flight_comes_back_updated_and_skips_the_pool() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    let mut respec = (*pod("a", 0)).clone();
    respec.spec.as_mut().unwrap().tolerations = Some(vec![Default::default()]);
    q.add(Arc::new(respec)).unwrap();
    assert_eq!(q.lengths(), QueueLengths { in_flight: 1, ..QueueLengths::default() });
    q.requeue_unschedulable(a, Hint::default());
    assert_eq!(q.lengths().backoff, 1);
    let again = must_pop_within(&q, Duration::from_secs(60)).await;
    assert!(again.pod.spec.as_ref().unwrap().tolerations.is_some());
}

fn insufficient() -> Hint {
    Hint::events(
        Events::NONE.with(ClusterEvent::NodeAdded).with(ClusterEvent::NodeChanged).with(ClusterEvent::PodDeleted),
    )
}

fn waiting_on(node: &str) -> Hint {
    Hint::holding_room(insufficient().events, node.into(), Duration::from_secs(5))
}

#[tokio::test(start_paused = true)]
async fn an_event_moves_only_the_pods_its_kind_may_help() {
    let q = queue();
    q.add(pod("selector", 0)).unwrap();
    q.add(pod("cpu", 0)).unwrap();
    let selector = must_pop_within(&q, NOW).await;
    let cpu = must_pop_within(&q, NOW).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    q.requeue_unschedulable(
        selector,
        Hint::events(Events::NONE.with(ClusterEvent::NodeAdded).with(ClusterEvent::NodeChanged)),
    );
    q.requeue_unschedulable(cpu, insufficient());
    tokio::time::advance(Duration::from_secs(30)).await;

    // A bound pod's labels changed, a pod was bound: neither helps.
    q.on_cluster_event(ClusterEvent::PodChanged, Some("n1"));
    q.on_cluster_event(ClusterEvent::AssignedPodAdded, Some("n1"));
    assert_eq!(q.lengths().unschedulable, 2);
    // A deletion frees room, but labels no node.
    q.on_cluster_event(ClusterEvent::PodDeleted, Some("n1"));
    assert_eq!(q.lengths().unschedulable, 1);
    assert_eq!(must_pop_within(&q, NOW).await.key, key("cpu"));
    q.on_cluster_event(ClusterEvent::NodeChanged, Some("n2"));
    assert_eq!(must_pop_within(&q, NOW).await.key, key("selector"));
}

#[tokio::test(start_paused = true)]
async fn a_pod_waiting_on_a_node_moves_for_that_node_or_a_new_one() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, waiting_on("n1"));
    tokio::time::advance(Duration::from_secs(2)).await;
    q.on_cluster_event(ClusterEvent::PodDeleted, Some("n2"));
    q.on_cluster_event(ClusterEvent::NodeChanged, Some("n2"));
    assert_eq!(q.lengths().unschedulable, 1, "events elsewhere leave it waiting");
    q.on_cluster_event(ClusterEvent::PodDeleted, Some("n1"));
    assert_eq!(q.lengths().active, 1, "its victim left");

    let a = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, waiting_on("n1"));
    q.on_cluster_event(ClusterEvent::NodeAdded, Some("n9"));
    assert_eq!(q.lengths().backoff, 1, "a node joining may have room");

    let a = must_pop_within(&q, Duration::from_secs(60)).await;
    q.requeue_unschedulable(a, waiting_on("n1"));
    q.on_cluster_event(ClusterEvent::NodeDeleted, Some("n1"));
    assert_eq!(q.lengths().backoff, 1, "the node it waited on is gone");
}

#[tokio::test(start_paused = true)]
async fn a_pod_waiting_on_a_node_is_tried_again_after_its_recheck_without_an_event() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    let parked = Instant::now();
    q.requeue_unschedulable(a, waiting_on("n1"));
    must_pop_within(&q, Duration::from_secs(3600)).await;
    assert_eq!(parked.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn only_an_event_its_hint_admits_during_the_attempt_sends_a_pod_to_backoff() {
    let q = queue();
    for name in ["a", "b", "c"] {
        q.add(pod(name, 0)).unwrap();
    }
    let a = must_pop_within(&q, NOW).await;
    q.on_cluster_event(ClusterEvent::PodDeleted, Some("n2"));
    q.on_cluster_event(ClusterEvent::AssignedPodAdded, Some("n1"));
    q.requeue_unschedulable(a, waiting_on("n1"));
    assert_eq!(q.lengths().unschedulable, 1, "a deletion elsewhere and a binding do not concern it");

    let b = must_pop_within(&q, NOW).await;
    q.on_cluster_event(ClusterEvent::PodDeleted, Some("n1"));
    // That deletion moved "a" too.
    assert_eq!(q.lengths().unschedulable, 0);
    q.requeue_unschedulable(b, waiting_on("n1"));
    assert_eq!(q.lengths().unschedulable, 0, "a deletion on its node during the attempt");

    let c = must_pop_within(&q, NOW).await;
    q.on_cluster_event(ClusterEvent::AssignedPodAdded, None);
    q.requeue_unschedulable(c, Hint::events(Events::NONE.with(ClusterEvent::AssignedPodAdded)));
    assert_eq!(q.lengths().unschedulable, 0, "an event on no node in particular counts");
}

#[tokio::test(start_paused = true)]
async fn move_all_moves_every_unschedulable_pod_whatever_its_hint() {
    let q = queue();
    q.add(pod("a", 0)).unwrap();
    q.add(pod("b", 0)).unwrap();
    let a = must_pop_within(&q, NOW).await;
    let b = must_pop_within(&q, NOW).await;
    q.requeue_unschedulable(a, Hint::events(Events::NONE));
    q.requeue_unschedulable(b, waiting_on("n1"));
    q.move_all();
    assert_eq!(q.lengths(), QueueLengths { backoff: 2, ..QueueLengths::default() });
}
