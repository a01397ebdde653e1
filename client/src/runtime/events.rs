//! Events, as `kubectl describe` lists them: a [`Recorder`] writes them
//! for a component and drops them once one object has had its burst, as
//! client-go's spam filter does, so a controller or scheduler failing in a
//! loop cannot flood the store with Events. An Event that repeats the last
//! one about the same object for the same reason raises that one's `count`
//! and `lastTimestamp` instead of adding another, as client-go's
//! EventLogger does: `kubectl describe` shows `(x3 over 2m)`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skiff_api::{meta, resources, Reason};

use crate::Client;

/// Events one object may get at once, and how often it earns another.
const EVENT_BURST: u32 = 25;
const EVENT_REFILL: Duration = Duration::from_secs(300);
/// Objects whose event budgets are remembered; the least recently used are forgotten.
const RECORDER_OBJECTS: usize = 4096;

/// Writes Events as `component`, at most [`EVENT_BURST`] per object and then
/// one per [`EVENT_REFILL`]. Failures to write an Event are logged only:
/// an Event is a hint to a human, never worth failing a reconcile.
pub struct Recorder {
    component: String,
    budgets: Mutex<Budgets>,
}

/// Each object's event budget (per reason), with the objects in the
/// order of their uses (an object used again is queued again; its earlier
/// places are skipped), so the least recently used is forgotten first
/// without a search through all of them.
#[derive(Default)]
struct Budgets {
    objects: HashMap<String, Budget>,
    order: VecDeque<(String, u64)>,
    uses: u64,
}

/// One object's budget for one reason.
struct Budget {
    /// Events it may still get now.
    tokens: f64,
    /// When `tokens` was counted.
    counted: Instant,
    /// The number of its last use.
    used: u64,
    /// The last Event written about it for this reason.
    last: Option<Written>,
}

/// An Event written, and how many times it has been said.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    type_: String,
    message: String,
    namespace: String,
    name: String,
    count: u64,
}

/// What to do with an Event.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// The object's budget is spent: drop it.
    Dropped,
    /// Write a new Event.
    New,
    /// Raise the count of the Event that said the same last time.
    Repeat { namespace: String, name: String, count: u64 },
}

impl Budgets {
    /// The budget of `key`, made room for and marked as used now.
    fn touch(&mut self, key: &str, now: Instant) -> &mut Budget {
        self.uses += 1;
        let used = self.uses;
        if !self.objects.contains_key(key) {
            while self.objects.len() >= RECORDER_OBJECTS {
                let Some((oldest, at)) = self.order.pop_front() else { break };
                if self.objects.get(&oldest).is_some_and(|b| b.used == at) {
                    self.objects.remove(&oldest);
                }
            }
        }
        self.order.push_back((key.to_string(), used));
        if self.order.len() > 2 * RECORDER_OBJECTS {
            let objects = &self.objects;
            self.order.retain(|(k, at)| objects.get(k).is_some_and(|b| b.used == *at));
        }
        let budget = self.objects.entry(key.to_string()).or_insert(Budget {
            tokens: EVENT_BURST as f64,
            counted: now,
            used,
            last: None,
        });
        budget.used = used;
        budget
    }
}

impl Recorder {
    /// A recorder whose Events name `component` as their source.
    pub fn new(component: impl Into<String>) -> Recorder {
        Recorder { component: component.into(), budgets: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Budgets> {
        self.budgets.lock().expect("recorder lock poisoned")
    }

    /// Whether an event about `object_key` (an object and a reason) saying
    /// `type_` and `message` may be sent now, and as what: a repeat of the
    /// last one written about it counts once more.
    fn admit(&self, object_key: &str, type_: &str, message: &str, now: Instant) -> Admission {
        let mut budgets = self.lock();
        let budget = budgets.touch(object_key, now);
        let earned = now.duration_since(budget.counted).as_secs_f64() / EVENT_REFILL.as_secs_f64();
        budget.tokens = (budget.tokens + earned).min(EVENT_BURST as f64);
        budget.counted = now;
        if budget.tokens < 1.0 {
            return Admission::Dropped;
        }
        budget.tokens -= 1.0;
        match &mut budget.last {
            Some(last) if last.type_ == type_ && last.message == message => {
                last.count += 1;
                Admission::Repeat { namespace: last.namespace.clone(), name: last.name.clone(), count: last.count }
            }
            _ => Admission::New,
        }
    }

    /// Remembers the Event just written about `object_key`, for its repeats.
    fn written(&self, object_key: &str, written: Written) {
        if let Some(budget) = self.lock().objects.get_mut(object_key) {
            budget.last = Some(written);
        }
    }

    /// Writes one Event about `regarding` (an object's JSON), unless its
    /// budget is spent; a repeat of the last one about it for `reason`
    /// raises that one's count instead.
    pub async fn record(&self, client: &Client, regarding: &Value, type_: &str, reason: &str, message: &str) {
        let uid = meta::uid(regarding).unwrap_or_default();
        let key = format!("{uid}/{reason}");
        let now = meta::now_rfc3339();
        let info = resources::of(skiff_api::Kind::Event);
        match self.admit(&key, type_, message, Instant::now()) {
            Admission::Dropped => return,
            Admission::New => {}
            Admission::Repeat { namespace, name, count } => {
                let patch = json!({"count": count, "lastTimestamp": now});
                match client.patch_raw(info, &namespace, &name, "merge", &patch, "").await {
                    Ok(_) => return,
                    // Deleted (or expired) since: said anew below.
                    Err(e) if e.is(Reason::NotFound) => {}
                    Err(e) => {
                        tracing::debug!(%reason, error = %e, "event count not raised");
                        return;
                    }
                }
            }
        }
        let event = event_for(&self.component, regarding, type_, reason, message, &now);
        let namespace = event["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        // The Event as stored is of no use here: its JSON is not decoded.
        match client.create_raw(info, &namespace, &event).await {
            Ok(_) => {
                let name = event["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let (type_, message) = (type_.to_string(), message.to_string());
                self.written(&key, Written { type_, message, namespace, name, count: 1 });
            }
            Err(e) => tracing::debug!(%reason, error = %e, "event not recorded"),
        }
    }
}

/// `<object>.<hex>`, as client-go names Events: the object's name and the
/// time in nanoseconds, plus a per-process count so two Events in the same
/// nanosecond differ. (A `generateName` of `<object>.` is not a valid
/// prefix: a name may not end in a dot.)
fn unique_name(object: &str) -> String {
    static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{object}.{:x}", nanos.wrapping_add(n))
}

/// A core/v1 Event about `regarding`, as `kubectl describe` lists them.
pub fn event_for(component: &str, regarding: &Value, type_: &str, reason: &str, message: &str, now: &str) -> Value {
    let name = meta::name(regarding).unwrap_or_default();
    // Cluster-scoped objects' events live in `default`, as in Kubernetes.
    let namespace = meta::namespace(regarding).filter(|n| !n.is_empty()).unwrap_or("default");
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": unique_name(name), "namespace": namespace},
        "involvedObject": {
            "apiVersion": regarding["apiVersion"],
            "kind": regarding["kind"],
            "name": name,
            "namespace": meta::namespace(regarding).unwrap_or_default(),
            "uid": meta::uid(regarding).unwrap_or_default(),
            "resourceVersion": meta::resource_version(regarding).unwrap_or_default(),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Recorder {
        /// Whether an event about `object_key` may be sent now.
        fn allow(&self, object_key: &str, now: Instant) -> bool {
            self.admit(object_key, "Warning", "the same", now) != Admission::Dropped
        }
    }

    fn written(message: &str) -> Written {
        let (namespace, name) = ("shop".to_string(), "web-1.17f".to_string());
        Written { type_: "Warning".into(), message: message.into(), namespace, name, count: 1 }
    }

    #[test]
    fn a_repeat_of_the_last_event_about_an_object_raises_its_count() {
        let recorder = Recorder::new("test");
        let now = Instant::now();
        let key = "uid-1/FailedScheduling";
        assert_eq!(recorder.admit(key, "Warning", "0/3 nodes", now), Admission::New);
        recorder.written(key, written("0/3 nodes"));
        for count in 2..=4 {
            let repeat = Admission::Repeat { namespace: "shop".into(), name: "web-1.17f".into(), count };
            assert_eq!(recorder.admit(key, "Warning", "0/3 nodes", now), repeat);
        }
        assert_eq!(recorder.admit(key, "Warning", "0/4 nodes", now), Admission::New, "another message");
        assert_eq!(recorder.admit(key, "Normal", "0/3 nodes", now), Admission::New, "another type");
        recorder.written(key, Written { type_: "Normal".into(), ..written("0/3 nodes") });
        let repeat = Admission::Repeat { namespace: "shop".into(), name: "web-1.17f".into(), count: 2 };
        assert_eq!(recorder.admit(key, "Normal", "0/3 nodes", now), repeat, "the last one written counts");
        assert_eq!(recorder.admit("uid-2/FailedScheduling", "Normal", "0/3 nodes", now), Admission::New);
    }

    #[test]
    fn repeats_spend_the_objects_budget_too() {
        let recorder = Recorder::new("test");
        let now = Instant::now();
        assert_eq!(recorder.admit("k", "Warning", "m", now), Admission::New);
        recorder.written("k", written("m"));
        let admitted = (0..40).filter(|_| recorder.admit("k", "Warning", "m", now) != Admission::Dropped).count();
        assert_eq!(admitted, EVENT_BURST as usize - 1);
    }

    #[test]
    fn an_object_gets_its_burst_of_events_then_one_per_refill() {
        let recorder = Recorder::new("test");
        let start = Instant::now();
        let sent = (0..40).filter(|_| recorder.allow("uid-1/FailedCreate", start)).count();
        assert_eq!(sent, EVENT_BURST as usize);
        assert!(!recorder.allow("uid-1/FailedCreate", start + EVENT_REFILL / 2));
        assert!(recorder.allow("uid-1/FailedCreate", start + EVENT_REFILL + EVENT_REFILL / 2));
        assert!(recorder.allow("uid-2/FailedCreate", start), "another object has its own budget");
    }

    #[test]
    fn the_recorder_forgets_the_oldest_objects_when_full() {
        let recorder = Recorder::new("test");
        let start = Instant::now();
        for i in 0..RECORDER_OBJECTS + 10 {
            recorder.allow(&format!("uid-{i}"), start + Duration::from_millis(i as u64));
        }
        let budgets = recorder.budgets.lock().unwrap();
        assert_eq!(budgets.objects.len(), RECORDER_OBJECTS);
        assert!(!budgets.objects.contains_key("uid-0"));
        assert!(budgets.order.len() <= 2 * RECORDER_OBJECTS);
    }

    #[test]
    fn an_object_used_again_is_forgotten_after_those_used_since() {
        let recorder = Recorder::new("test");
        let start = Instant::now();
        let at = |ms: usize| start + Duration::from_millis(ms as u64);
        for _ in 0..EVENT_BURST {
            assert!(recorder.allow("busy", at(0)));
        }
        assert!(!recorder.allow("busy", at(1)), "its burst is spent");
        // Many objects come and go; the busy one keeps being used, so it
        // is never the least recently used and its spent budget stays.
        for i in 0..3 * RECORDER_OBJECTS {
            recorder.allow(&format!("uid-{i}"), at(2 + i));
            if i % 1000 == 0 {
                assert!(!recorder.allow("busy", at(2 + i)), "forgotten while in use, at {i}");
            }
        }
        let budgets = recorder.budgets.lock().unwrap();
        assert_eq!(budgets.objects.len(), RECORDER_OBJECTS);
        assert!(budgets.objects.contains_key("busy"));
        assert!(budgets.order.len() <= 2 * RECORDER_OBJECTS);
    }

    #[test]
    fn an_event_names_its_object_and_lives_in_its_namespace() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "resourceVersion": "7"}});
        let ev = event_for("replicaset-controller", &pod, "Warning", "FailedCreate", "quota", "2026-01-01T00:00:00Z");
        assert_eq!(ev["metadata"]["namespace"], "shop");
        let name = ev["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-1.") && name.len() > "web-1.".len(), "{name}");
        let again =
            event_for("replicaset-controller", &pod, "Warning", "FailedCreate", "quota", "2026-01-01T00:00:00Z");
        assert_ne!(again["metadata"]["name"], ev["metadata"]["name"], "every Event has a name of its own");
        assert_eq!(ev["involvedObject"]["uid"], "u1");
        assert_eq!(ev["involvedObject"]["kind"], "Pod");
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u2"}});
        let ev = event_for("node-lifecycle-controller", &node, "Normal", "NodeNotReady", "", "");
        assert_eq!(ev["metadata"]["namespace"], "default");
    }
}
