//! LimitRanger admission, as Kubernetes' plugin of that name: a new pod's
//! containers get the `default` limits and `defaultRequest` requests of
//! their namespace's LimitRanges for the resources they do not set, then
//! the pod is refused if a container (type `Container`) or the whole pod
//! (type `Pod`) is outside a range's `min`, `max` or
//! `maxLimitRequestRatio`. What was defaulted is recorded in the pod's
//! `kubernetes.io/limit-ranger` annotation.
//!
//! As in Kubernetes, a range's `default` falls back to its `max` and its
//! `defaultRequest` to its `default`, then its `min`.
//!
//! Like [`crate::priority`], it is a step of the registry because it reads
//! the namespace's LimitRanges; they are read as this member has applied
//! them (Kubernetes reads its informer cache), once per create, and the
//! rules are plain functions of what was read.

use serde_json::{json, Map, Value};
use skiff_api::quantity::parse_quantity;
use skiff_api::resources::{self, Kind};
use skiff_api::ApiError;

use crate::admission::{forbidden, Attributes};
use crate::storage::{prefix_end, Consistency, ObjectStore};

const ANNOTATION: &str = "kubernetes.io/limit-ranger";

/// The LimitRanges that apply to a write: those of the namespace of a pod
/// being created; none for anything else.
pub(crate) async fn ranges_for(objects: &ObjectStore, attrs: &Attributes<'_>) -> Result<Vec<Value>, ApiError> {
    if !(attrs.resource.kind_id == Kind::Pod && attrs.verb == "create" && attrs.subresource.is_empty()) {
        return Ok(Vec::new());
    }
    let revision = objects.prepare_read(Consistency::Any).await?;
    let prefix = resources::of(Kind::LimitRange).namespace_prefix(Some(attrs.namespace));
    let page = objects.range_small(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), revision)?;
    page.items.iter().map(|s| s.decode()).collect()
}

/// Defaults, then checks, a new pod against `ranges`.
pub(crate) fn admit(attrs: &Attributes<'_>, pod: &mut Value, ranges: &[Value]) -> Result<(), ApiError> {
    if ranges.is_empty() {
        return Ok(());
    }
    set_defaults(pod, ranges);
    let errors = violations(pod, ranges);
    match errors.len() {
        0 => Ok(()),
        1 => Err(forbidden(attrs, &errors[0])),
        _ => Err(forbidden(attrs, &format!("[{}]", errors.join(", ")))),
    }
}

/// One `spec.limits` item of type `kind`, with Kubernetes' defaulting.
struct Item {
    min: Map<String, Value>,
    max: Map<String, Value>,
    default_limit: Map<String, Value>,
    default_request: Map<String, Value>,
    ratio: Map<String, Value>,
}

fn items<'a>(ranges: &'a [Value], kind: &'a str) -> impl Iterator<Item = Item> + 'a {
    ranges
        .iter()
        .flat_map(|r| r["spec"]["limits"].as_array().into_iter().flatten())
        .filter(move |i| i["type"].as_str() == Some(kind))
        .map(|i| {
            let map = |field: &str| i[field].as_object().cloned().unwrap_or_default();
            let (min, max) = (map("min"), map("max"));
            let mut default_limit = map("default");
            let mut default_request = map("defaultRequest");
            for (r, q) in &max {
                default_limit.entry(r.clone()).or_insert(q.clone());
            }
            for (r, q) in default_limit.iter().chain(min.iter()) {
                default_request.entry(r.clone()).or_insert(q.clone());
            }
            Item { min, max, default_limit, default_request, ratio: map("maxLimitRequestRatio") }
        })
}

fn containers(pod: &mut Value) -> impl Iterator<Item = &mut Value> {
    let spec = &mut pod["spec"];
    let mut all: Vec<&mut Value> = Vec::new();
    if let Value::Object(spec) = spec {
        for (field, list) in spec.iter_mut() {
            if field == "containers" || field == "initContainers" {
                if let Value::Array(list) = list {
                    all.extend(list.iter_mut());
                }
            }
        }
    }
    all.into_iter()
}

/// Fills in each container's missing limits and requests from the
/// `Container` items; notes what it set in the annotation.
fn set_defaults(pod: &mut Value, ranges: &[Value]) {
    let defaults: Vec<Item> = items(ranges, "Container").collect();
    let mut notes = Vec::new();
    for c in containers(pod) {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        for (field, what) in [("requests", "request"), ("limits", "limit")] {
            // The first range to default a resource wins.
            let mut missing = Map::new();
            for item in &defaults {
                let source = if field == "limits" { &item.default_limit } else { &item.default_request };
                for (r, q) in source {
                    if c["resources"][field].get(r).is_none() && !missing.contains_key(r) {
                        missing.insert(r.clone(), q.clone());
                    }
                }
            }
            if missing.is_empty() {
                continue;
            }
            // Malformed containers are left to validation, which refuses them.
            let Some(Value::Object(resources)) =
                c.as_object_mut().map(|c| c.entry("resources").or_insert_with(|| json!({})))
            else {
                continue;
            };
            let Value::Object(target) = resources.entry(field).or_insert_with(|| json!({})) else { continue };
            notes.push(format!(
                "{} {what} for container {name}",
                missing.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            target.extend(missing);
        }
    }
    if notes.is_empty() {
        return;
    }
    if let Some(Value::Object(meta)) = pod.get_mut("metadata") {
        if let Value::Object(annotations) = meta.entry("annotations").or_insert_with(|| json!({})) {
            annotations.insert(ANNOTATION.into(), json!(format!("LimitRanger plugin set: {}", notes.join("; "))));
        }
    }
    // Defaulting computed the QoS class from what the client sent.
    let qos = skiff_api::defaults::qos_class(&pod["spec"]);
    if let Some(Value::Object(status)) = pod.get_mut("status") {
        status.insert("qosClass".into(), json!(qos));
    }
}

/// A quantity in thousandths; unparsable ones were refused by validation.
fn milli(q: &Value) -> Option<i128> {
    match q {
        Value::String(s) => parse_quantity(s).ok(),
        Value::Number(n) => parse_quantity(&n.to_string()).ok(),
        _ => None,
    }
}

fn text(q: &Value) -> String {
    match q {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A container's or a pod's requests and limits, by resource.
#[derive(Default)]
struct Usage {
    requests: Map<String, Value>,
    limits: Map<String, Value>,
}

/// What is wrong with `pod` under the ranges, in Kubernetes' words.
fn violations(pod: &Value, ranges: &[Value]) -> Vec<String> {
    let mut errors = Vec::new();
    let spec = &pod["spec"];
    let list = |field: &str| spec[field].as_array().cloned().unwrap_or_default();
    let usage_of = |c: &Value| Usage {
        requests: c["resources"]["requests"].as_object().cloned().unwrap_or_default(),
        limits: c["resources"]["limits"].as_object().cloned().unwrap_or_default(),
    };
    let (main, init) = (list("containers"), list("initContainers"));
    for item in items(ranges, "Container") {
        for c in main.iter().chain(init.iter()) {
            check(&item, "Container", &usage_of(c), &mut errors);
        }
    }
    let pod_items: Vec<Item> = items(ranges, "Pod").collect();
    if !pod_items.is_empty() {
        let usage =
            pod_usage(&main.iter().map(usage_of).collect::<Vec<_>>(), &init.iter().map(usage_of).collect::<Vec<_>>());
        for item in &pod_items {
            check(item, "Pod", &usage, &mut errors);
        }
    }
    errors
}

/// A pod's usage of each resource: the sum over its containers, or its
/// largest init container if that is more. A resource some container does
/// not set is not set for the pod.
fn pod_usage(main: &[Usage], init: &[Usage]) -> Usage {
    let total = |pick: fn(&Usage) -> &Map<String, Value>| -> Map<String, Value> {
        let mut names: Vec<&String> = main.iter().chain(init.iter()).flat_map(|u| pick(u).keys()).collect();
        names.sort();
        names.dedup();
        let mut out = Map::new();
        for r in names {
            let sum: Option<i128> = main.iter().map(|u| pick(u).get(r).and_then(milli)).sum();
            let init_max: Option<i128> = init
                .iter()
                .map(|u| pick(u).get(r).and_then(milli))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.into_iter().max().unwrap_or(0));
            if let (Some(sum), Some(init_max)) = (sum, init_max) {
                out.insert(r.clone(), json!(format_milli(sum.max(init_max))));
            }
        }
        out
    };
    Usage { requests: total(|u| &u.requests), limits: total(|u| &u.limits) }
}

/// Thousandths as a quantity: `1500m`, `2`.
fn format_milli(m: i128) -> String {
    if m % 1000 == 0 {
        (m / 1000).to_string()
    } else {
        format!("{m}m")
    }
}

fn check(item: &Item, kind: &str, usage: &Usage, errors: &mut Vec<String>) {
    for (r, min) in &item.min {
        let Some(least) = milli(min) else { continue };
        match usage.requests.get(r) {
            None => errors.push(format!("minimum {r} usage per {kind} is {}.  No request is specified", text(min))),
            Some(q) if milli(q).is_some_and(|v| v < least) => {
                errors.push(format!("minimum {r} usage per {kind} is {}, but request is {}", text(min), text(q)))
            }
            _ => {}
        }
        if let Some(q) = usage.limits.get(r).filter(|q| milli(q).is_some_and(|v| v < least)) {
            errors.push(format!("minimum {r} usage per {kind} is {}, but limit is {}", text(min), text(q)));
        }
    }
    for (r, max) in &item.max {
        let Some(most) = milli(max) else { continue };
        match usage.limits.get(r) {
            None => errors.push(format!("maximum {r} usage per {kind} is {}.  No limit is specified", text(max))),
            Some(q) if milli(q).is_some_and(|v| v > most) => {
                errors.push(format!("maximum {r} usage per {kind} is {}, but limit is {}", text(max), text(q)))
            }
            _ => {}
        }
        if let Some(q) = usage.requests.get(r).filter(|q| milli(q).is_some_and(|v| v > most)) {
            errors.push(format!("maximum {r} usage per {kind} is {}, but request is {}", text(max), text(q)));
        }
    }
    for (r, ratio) in &item.ratio {
        let Some(ratio_m) = milli(ratio) else { continue };
        let (Some(request), Some(limit)) = (usage.requests.get(r).and_then(milli), usage.limits.get(r).and_then(milli))
        else {
            if usage.limits.get(r).is_none() {
                errors.push(format!(
                    "{r} max limit to request ratio per {kind} is {}, but no limit is specified",
                    text(ratio)
                ));
            } else {
                errors.push(format!(
                    "{r} max limit to request ratio per {kind} is {}, but no request is specified",
                    text(ratio)
                ));
            }
            continue;
        };
        if request > 0 && limit * 1000 > ratio_m * request {
            errors.push(format!(
                "{r} max limit to request ratio per {kind} is {}, but provided ratio is {:.6}",
                text(ratio),
                limit as f64 / request as f64
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::UserInfo;

    fn range(limits: Value) -> Value {
        json!({"kind": "LimitRange", "metadata": {"name": "lr", "namespace": "team"}, "spec": {"limits": limits}})
    }

    fn pod(containers: Value) -> Value {
        json!({"kind": "Pod", "metadata": {"name": "web", "namespace": "team"}, "spec": {"containers": containers}})
    }

    fn run(ranges: &[Value], pod: &mut Value) -> Result<(), String> {
        let user = UserInfo { name: "alice".into(), groups: vec![] };
        let attrs = Attributes {
            user: &user,
            verb: "create",
            resource: resources::of(Kind::Pod),
            subresource: "",
            namespace: "team",
            name: "web",
        };
        admit(&attrs, pod, ranges).map_err(|e| e.to_string())
    }

    #[test]
    fn missing_limits_and_requests_take_the_defaults_and_say_so() {
        let ranges = [range(json!([{"type": "Container", "default": {"cpu": "500m", "memory": "256Mi"},
            "defaultRequest": {"cpu": "100m"}}]))];
        let mut p = pod(json!([{"name": "a", "image": "i"},
            {"name": "b", "image": "i", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}}]));
        run(&ranges, &mut p).unwrap();
        let a = &p["spec"]["containers"][0]["resources"];
        assert_eq!(a["limits"], json!({"cpu": "500m", "memory": "256Mi"}));
        // The memory request falls back to the default limit, as in Kubernetes.
        assert_eq!(a["requests"], json!({"cpu": "100m", "memory": "256Mi"}));
        let b = &p["spec"]["containers"][1]["resources"];
        assert_eq!(b["limits"], json!({"cpu": "1", "memory": "256Mi"}), "only what b left out");
        assert_eq!(b["requests"], json!({"cpu": "1", "memory": "256Mi"}));
        let note = p["metadata"]["annotations"][ANNOTATION].as_str().unwrap();
        assert_eq!(
            note,
            "LimitRanger plugin set: cpu, memory request for container a; cpu, memory limit for container a; \
             memory request for container b; memory limit for container b"
        );
    }

    #[test]
    fn defaults_fall_back_to_max_then_min() {
        let ranges = [range(json!([{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}}]))];
        let mut p = pod(json!([{"name": "a", "image": "i"}]));
        run(&ranges, &mut p).unwrap();
        let r = &p["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"], json!({"cpu": "2"}));
        assert_eq!(r["requests"], json!({"cpu": "2", "memory": "64Mi"}));
    }

    #[test]
    fn containers_outside_min_max_or_ratio_are_refused_with_kubernetes_messages() {
        let ranges = [range(json!([{"type": "Container", "min": {"cpu": "100m"}, "max": {"memory": "1Gi"},
            "maxLimitRequestRatio": {"cpu": "2"}}]))];
        let err = run(
            &ranges,
            &mut pod(json!([{"name": "a", "image": "i",
            "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "50m", "memory": "2Gi"}}}])),
        )
        .unwrap_err();
        assert!(err.contains("pods \"web\" is forbidden: ["), "{err}");
        assert!(err.contains("minimum cpu usage per Container is 100m, but request is 50m"), "{err}");
        assert!(err.contains("minimum cpu usage per Container is 100m, but limit is 50m"), "{err}");
        assert!(err.contains("maximum memory usage per Container is 1Gi, but limit is 2Gi"), "{err}");
        let err = run(
            &ranges,
            &mut pod(json!([{"name": "a", "image": "i",
            "resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "1", "memory": "1Gi"}}}])),
        )
        .unwrap_err();
        assert!(
            err.ends_with("cpu max limit to request ratio per Container is 2, but provided ratio is 5.000000"),
            "{err}"
        );
        // max defaults the limit, so a container that says nothing fits.
        let mut no_cpu_limit = pod(json!([{"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]));
        let err = run(&ranges, &mut no_cpu_limit).unwrap_err();
        assert!(err.ends_with("cpu max limit to request ratio per Container is 2, but no limit is specified"), "{err}");
        let mut fine = pod(json!([{"name": "a", "image": "i",
            "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}}]));
        run(&ranges, &mut fine).unwrap();
        assert_eq!(fine["spec"]["containers"][0]["resources"]["limits"]["memory"], "1Gi");
    }

    #[test]
    fn pod_limits_count_every_container_and_the_largest_init_container() {
        let ranges = [range(json!([{"type": "Pod", "max": {"cpu": "1"}, "min": {"cpu": "200m"}}]))];
        let with = |cpus: &[&str], init: &[&str]| {
            let c = |n: usize, cpu: &&str| {
                json!({"name": format!("c{n}"), "image": "i",
                "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}})
            };
            let mut p = pod(Value::Array(cpus.iter().enumerate().map(|(n, cpu)| c(n, cpu)).collect()));
            p["spec"]["initContainers"] =
                Value::Array(init.iter().enumerate().map(|(n, cpu)| c(n + 10, cpu)).collect());
            p
        };
        run(&ranges, &mut with(&["500m", "500m"], &["1"])).unwrap();
        let err = run(&ranges, &mut with(&["600m", "500m"], &[])).unwrap_err();
        assert!(err.contains("maximum cpu usage per Pod is 1, but limit is 1100m"), "{err}");
        let err = run(&ranges, &mut with(&["100m"], &["1500m"])).unwrap_err();
        assert!(err.contains("maximum cpu usage per Pod is 1, but limit is 1500m"), "{err}");
        let err = run(&ranges, &mut with(&["50m", "50m"], &[])).unwrap_err();
        assert!(err.contains("minimum cpu usage per Pod is 200m, but request is 100m"), "{err}");
        let err = run(&ranges, &mut pod(json!([{"name": "a", "image": "i"}]))).unwrap_err();
        assert!(err.contains("No request is specified") && err.contains("No limit is specified"), "{err}");
    }

    #[test]
    fn without_ranges_nothing_changes() {
        let mut p = pod(json!([{"name": "a", "image": "i"}]));
        let before = p.clone();
        run(&[], &mut p).unwrap();
        run(&[range(json!([{"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}]))], &mut p).unwrap();
        assert_eq!(p, before);
    }
}
