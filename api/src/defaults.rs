//! Defaulting, as Kubernetes defaults the fields Skiff uses
//! (`pkg/apis/*/v1/defaults.go`, plus what the pod and namespace strategies
//! and the priority admission plugin fill in on create).
//!
//! [`apply`] works on the normalized JSON, fills only what is missing, and
//! is idempotent: applying it twice gives the same object. It never panics:
//! a field of an unexpected shape is left alone.
//!
//! Pod templates (in Deployments, ReplicaSets, DaemonSets, Jobs and
//! CronJobs) get the pod *spec* defaults; pods themselves also get what
//! Kubernetes sets only on pods: `enableServiceLinks`, `priority`, requests
//! copied from limits, and the initial `status` (phase and QoS class).
//! IP addresses and node ports are the allocator's business, not this.

use serde_json::{json, Map, Value};

use crate::resources::{Kind, ResourceInfo};
use crate::validation::quantity::Quantity;

/// Fills in defaults on a normalized object.
pub fn apply(info: &ResourceInfo, obj: &mut Value) {
    if !obj.is_object() {
        return;
    }
    match info.kind_id {
        Kind::Pod => pod(obj),
        Kind::Service => {
            if let Some(spec) = child(obj, "spec") {
                service_spec(spec);
            }
        }
        Kind::Deployment => deployment(obj),
        Kind::ReplicaSet => {
            if let Some(spec) = child(obj, "spec") {
                set(spec, "replicas", json!(1));
                template(spec);
            }
        }
        Kind::ReplicationController => replication_controller(obj),
        Kind::DaemonSet => daemon_set(obj),
        Kind::Job => job(obj),
        Kind::CronJob => cron_job(obj),
        Kind::Secret => set(obj, "type", json!("Opaque")),
        Kind::Namespace => namespace(obj),
        Kind::Endpoints => {
            for subset in array(obj, "subsets") {
                for port in array(subset, "ports") {
                    set(port, "protocol", json!("TCP"));
                }
            }
        }
        Kind::EndpointSlice => {
            for port in array(obj, "ports") {
                set(port, "name", json!(""));
                set(port, "protocol", json!("TCP"));
            }
        }
        Kind::Node => node(obj),
        Kind::LimitRange => limit_range(obj),
        Kind::PriorityClass => set(obj, "preemptionPolicy", json!("PreemptLowerPriority")),
        Kind::CustomResourceDefinition => crate::custom::default_definition(obj),
        Kind::Custom => crate::custom::default(info, obj),
        Kind::RoleBinding | Kind::ClusterRoleBinding => {
            // Kubernetes' `SetDefaults_Subject`: users and groups are RBAC's.
            for subject in array(obj, "subjects") {
                match subject.get("kind").and_then(Value::as_str) {
                    Some("User" | "Group") => set(subject, "apiGroup", json!("rbac.authorization.k8s.io")),
                    Some("ServiceAccount") => set(subject, "apiGroup", json!("")),
                    _ => {}
                }
            }
        }
        Kind::ConfigMap
        | Kind::PodDisruptionBudget
        | Kind::ServiceAccount
        | Kind::Event
        | Kind::Lease
        | Kind::ResourceQuota
        | Kind::Role
        | Kind::ClusterRole => {}
    }
}

// ---- helpers on JSON objects; none of them panics on a wrong shape

/// `obj[key]`, created as `{}` if missing or null; `None` if `obj` is not an
/// object or the field holds something other than an object.
fn child<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    let m = obj.as_object_mut()?;
    let v = m.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if v.is_null() {
        *v = Value::Object(Map::new());
    }
    v.is_object().then_some(v)
}

/// `obj[key]` if it is already an object.
fn existing<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    obj.as_object_mut()?.get_mut(key).filter(|v| v.is_object())
}

/// The elements of the array at `obj[key]`, if any.
fn array<'a>(obj: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    obj.as_object_mut().and_then(|m| m.get_mut(key)).and_then(Value::as_array_mut).into_iter().flatten()
}

/// Sets `obj[key]` unless it holds a value already (null and "" count as unset).
fn set(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut() {
        let unset = match m.get(key) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if unset {
            m.insert(key.to_string(), value);
        }
    }
}

fn has(obj: &Value, key: &str) -> bool {
    obj.get(key).is_some_and(|v| !v.is_null())
}

fn str_of<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get(key).and_then(Value::as_str).unwrap_or("")
}

// ---- pods

fn pod(obj: &mut Value) {
    if let Some(spec) = child(obj, "spec") {
        pod_spec(spec);
        set(spec, "enableServiceLinks", json!(true));
        set(spec, "priority", json!(0));
        for list in ["initContainers", "containers"] {
            for c in array(spec, list) {
                requests_from_limits(c);
            }
        }
        if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
            for list in ["initContainers", "containers"] {
                for c in array(spec, list) {
                    for port in array(c, "ports") {
                        if let Some(cp) = port.get("containerPort").cloned() {
                            set(port, "hostPort", cp);
                        }
                    }
                }
            }
        }
    }
    let status_missing = obj.get("status").is_none_or(|s| s.is_null() || s.as_object().is_some_and(Map::is_empty));
    if status_missing {
        let qos = qos_class(obj.get("spec").unwrap_or(&Value::Null));
        if let Some(m) = obj.as_object_mut() {
            m.insert("status".into(), json!({"phase": "Pending", "qosClass": qos}));
        }
    }
}

/// On pods only: a resource with a limit and no request requests its limit.
fn requests_from_limits(c: &mut Value) {
    let Some(res) = existing(c, "resources") else { return };
    let Some(limits) = res.get("limits").and_then(Value::as_object).cloned() else { return };
    if limits.is_empty() {
        return;
    }
    let Some(requests) = child(res, "requests").and_then(Value::as_object_mut) else { return };
    for (k, v) in limits {
        requests.entry(k).or_insert(v);
    }
}

/// What `SetDefaults_PodSpec` and the container, port, probe and volume
/// defaults fill in, for pods and templates alike.
fn pod_spec(spec: &mut Value) {
    set(spec, "restartPolicy", json!("Always"));
    set(spec, "dnsPolicy", json!("ClusterFirst"));
    set(spec, "schedulerName", json!("default-scheduler"));
    set(spec, "terminationGracePeriodSeconds", json!(30));
    set(spec, "securityContext", json!({}));
    for list in ["initContainers", "containers"] {
        for c in array(spec, list) {
            container(c);
        }
    }
    for vol in array(spec, "volumes") {
        volume(vol);
    }
}

fn container(c: &mut Value) {
    let policy = if pulls_always(str_of(c, "image")) { "Always" } else { "IfNotPresent" };
    set(c, "imagePullPolicy", json!(policy));
    set(c, "terminationMessagePath", json!("/dev/termination-log"));
    set(c, "terminationMessagePolicy", json!("File"));
    for port in array(c, "ports") {
        set(port, "protocol", json!("TCP"));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = existing(c, probe) {
            set(p, "timeoutSeconds", json!(1));
            set(p, "periodSeconds", json!(10));
            set(p, "successThreshold", json!(1));
            set(p, "failureThreshold", json!(3));
            http_get(p);
        }
    }
    if let Some(lifecycle) = existing(c, "lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(h) = existing(lifecycle, hook) {
                http_get(h);
            }
        }
    }
    for env in array(c, "env") {
        if let Some(field_ref) = existing(env, "valueFrom").and_then(|f| existing(f, "fieldRef")) {
            set(field_ref, "apiVersion", json!("v1"));
        }
    }
}

fn http_get(handler: &mut Value) {
    if let Some(h) = existing(handler, "httpGet") {
        set(h, "path", json!("/"));
        set(h, "scheme", json!("HTTP"));
    }
}

/// `Always` when the image has the tag `latest` or no tag and no digest.
fn pulls_always(image: &str) -> bool {
    let (name, digest) = match image.split_once('@') {
        Some((n, _)) => (n, true),
        None => (image, false),
    };
    // The tag follows the last `:` after the last `/` (`host:5000/app` has none).
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => !digest,
    }
}

/// The volume kinds whose files get mode 0644 by default.
const DEFAULT_MODE_SOURCES: &[&str] = &["secret", "configMap", "downwardAPI", "projected"];

fn volume(vol: &mut Value) {
    let Some(m) = vol.as_object_mut() else { return };
    if !m.iter().any(|(k, v)| k != "name" && !v.is_null()) {
        m.insert("emptyDir".into(), json!({}));
    }
    for source in DEFAULT_MODE_SOURCES {
        if let Some(s) = existing(vol, source) {
            set(s, "defaultMode", json!(420));
        }
    }
}

/// Guaranteed, Burstable or BestEffort, from the cpu and memory requests
/// and limits of all containers (Kubernetes' `GetPodQOS`).
pub fn qos_class(spec: &Value) -> &'static str {
    const COMPUTE: [&str; 2] = ["cpu", "memory"];
    let mut requests: [Option<Quantity>; 2] = [None, None];
    let mut limits: [Option<Quantity>; 2] = [None, None];
    let mut guaranteed = true;
    let add = |acc: &mut Option<Quantity>, q: Quantity| {
        *acc = Some(match acc {
            Some(a) => a.checked_add(&q).unwrap_or(*a),
            None => q,
        });
    };
    for list in ["initContainers", "containers"] {
        for c in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            let res = c.get("resources").unwrap_or(&Value::Null);
            let read = |field: &str, name: &str| {
                res.get(field).and_then(|m| m.get(name)).and_then(Value::as_str).and_then(Quantity::parse)
            };
            let mut limits_found = 0;
            for (i, name) in COMPUTE.iter().enumerate() {
                if let Some(q) = read("requests", name).filter(|q| !q.is_zero()) {
                    add(&mut requests[i], q);
                }
                if let Some(q) = read("limits", name).filter(|q| !q.is_zero()) {
                    add(&mut limits[i], q);
                    limits_found += 1;
                }
            }
            if limits_found != COMPUTE.len() {
                guaranteed = false;
            }
        }
    }
    if requests.iter().all(Option::is_none) && limits.iter().all(Option::is_none) {
        return "BestEffort";
    }
    if guaranteed {
        for (req, lim) in requests.iter().zip(&limits) {
            if let Some(r) = req {
                if !lim.is_some_and(|l| l.cmp(r) == std::cmp::Ordering::Equal) {
                    guaranteed = false;
                }
            }
        }
    }
    let same_count = requests.iter().filter(|r| r.is_some()).count() == limits.iter().filter(|l| l.is_some()).count();
    if guaranteed && same_count {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// `spec.template.spec` of a workload.
fn template(spec: &mut Value) {
    if let Some(pod_spec_v) = existing(spec, "template").and_then(|t| existing(t, "spec")) {
        pod_spec(pod_spec_v);
    }
}

// ---- services

fn service_spec(spec: &mut Value) {
    set(spec, "type", json!("ClusterIP"));
    set(spec, "sessionAffinity", json!("None"));
    match str_of(spec, "sessionAffinity") {
        "None" => {
            if let Some(m) = spec.as_object_mut() {
                m.remove("sessionAffinityConfig");
            }
        }
        "ClientIP" => {
            let has_timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.get("clientIP"))
                .and_then(|c| c.get("timeoutSeconds"))
                .is_some_and(|t| !t.is_null());
            if !has_timeout {
                if let Some(m) = spec.as_object_mut() {
                    m.insert("sessionAffinityConfig".into(), json!({"clientIP": {"timeoutSeconds": 10800}}));
                }
            }
        }
        _ => {}
    }
    for port in array(spec, "ports") {
        set(port, "protocol", json!("TCP"));
        let unset = match port.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if unset {
            if let Some(p) = port.get("port").cloned() {
                if let Some(m) = port.as_object_mut() {
                    m.insert("targetPort".into(), p);
                }
            }
        }
    }
    let ty = str_of(spec, "type").to_string();
    let has_external_ips = spec.get("externalIPs").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    if ty == "NodePort" || ty == "LoadBalancer" || (ty == "ClusterIP" && has_external_ips) {
        set(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if matches!(ty.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer") {
        set(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        set(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

// ---- workloads

fn deployment(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    set(spec, "replicas", json!(1));
    if let Some(strategy) = child(spec, "strategy") {
        set(strategy, "type", json!("RollingUpdate"));
        if str_of(strategy, "type") == "RollingUpdate" {
            if let Some(ru) = child(strategy, "rollingUpdate") {
                set(ru, "maxUnavailable", json!("25%"));
                set(ru, "maxSurge", json!("25%"));
            }
        }
    }
    set(spec, "revisionHistoryLimit", json!(10));
    set(spec, "progressDeadlineSeconds", json!(600));
    template(spec);
}

/// As Kubernetes: an RC without a selector selects its template's labels,
/// and one without labels of its own takes them too.
fn replication_controller(obj: &mut Value) {
    let template_labels = obj
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        .cloned();
    if let Some(labels) = &template_labels {
        if let Some(meta) = child(obj, "metadata") {
            if meta.get("labels").is_none_or(|l| l.as_object().is_none_or(Map::is_empty)) {
                if let Some(m) = meta.as_object_mut() {
                    m.insert("labels".into(), labels.clone());
                }
            }
        }
    }
    let Some(spec) = child(obj, "spec") else { return };
    if let Some(labels) = template_labels {
        if spec.get("selector").is_none_or(|s| s.as_object().is_none_or(Map::is_empty)) {
            if let Some(m) = spec.as_object_mut() {
                m.insert("selector".into(), labels);
            }
        }
    }
    set(spec, "replicas", json!(1));
    template(spec);
}

fn daemon_set(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    if let Some(strategy) = child(spec, "updateStrategy") {
        set(strategy, "type", json!("RollingUpdate"));
        if str_of(strategy, "type") == "RollingUpdate" {
            if let Some(ru) = child(strategy, "rollingUpdate") {
                set(ru, "maxUnavailable", json!(1));
                set(ru, "maxSurge", json!(0));
            }
        }
    }
    set(spec, "revisionHistoryLimit", json!(10));
    template(spec);
}

fn job(obj: &mut Value) {
    let template_labels = obj
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        .cloned();
    if let Some(labels) = template_labels {
        if let Some(meta) = child(obj, "metadata") {
            let empty = meta.get("labels").is_none_or(|l| l.as_object().is_none_or(Map::is_empty));
            if empty {
                if let Some(m) = meta.as_object_mut() {
                    m.insert("labels".into(), labels);
                }
            }
        }
    }
    let Some(spec) = child(obj, "spec") else { return };
    if !has(spec, "completions") && !has(spec, "parallelism") {
        set(spec, "completions", json!(1));
    }
    set(spec, "parallelism", json!(1));
    let backoff = if has(spec, "backoffLimitPerIndex") { i64::from(i32::MAX) } else { 6 };
    set(spec, "backoffLimit", json!(backoff));
    set(spec, "completionMode", json!("NonIndexed"));
    set(spec, "suspend", json!(false));
    let replacement = if has(spec, "podFailurePolicy") { "Failed" } else { "TerminatingOrFailed" };
    set(spec, "podReplacementPolicy", json!(replacement));
    template(spec);
}

fn cron_job(obj: &mut Value) {
    let Some(spec) = child(obj, "spec") else { return };
    set(spec, "concurrencyPolicy", json!("Allow"));
    set(spec, "suspend", json!(false));
    set(spec, "successfulJobsHistoryLimit", json!(3));
    set(spec, "failedJobsHistoryLimit", json!(1));
    // As in Kubernetes, the job template gets the pod template defaults only;
    // the Job defaults apply when the controller creates the Job.
    if let Some(job_spec) = existing(spec, "jobTemplate").and_then(|jt| existing(jt, "spec")) {
        template(job_spec);
    }
}

// ---- the rest

fn namespace(obj: &mut Value) {
    if let Some(spec) = child(obj, "spec") {
        set(spec, "finalizers", json!(["kubernetes"]));
    }
    if let Some(status) = child(obj, "status") {
        set(status, "phase", json!("Active"));
    }
    let name = obj.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("").to_string();
    if name.is_empty() {
        return;
    }
    if let Some(labels) = child(obj, "metadata").and_then(|m| child(m, "labels")).and_then(Value::as_object_mut) {
        labels.insert("kubernetes.io/metadata.name".into(), Value::String(name));
    }
}

fn node(obj: &mut Value) {
    let Some(status) = existing(obj, "status") else { return };
    if let Some(capacity) = status.get("capacity").filter(|c| c.is_object()).cloned() {
        set(status, "allocatable", capacity);
    }
}

fn limit_range(obj: &mut Value) {
    let Some(spec) = existing(obj, "spec") else { return };
    for item in array(spec, "limits") {
        if str_of(item, "type") != "Container" {
            continue;
        }
        let read = |item: &Value, f: &str| item.get(f).and_then(Value::as_object).cloned().unwrap_or_default();
        // default <- max; defaultRequest <- default, then min.
        for (from, to) in [("max", "default"), ("default", "defaultRequest"), ("min", "defaultRequest")] {
            let source = read(item, from);
            if source.is_empty() {
                continue;
            }
            let Some(target) = child(item, to).and_then(Value::as_object_mut) else { continue };
            for (k, v) in source {
                target.entry(k).or_insert(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::of;
    use crate::validation::normalize;

    fn defaulted(kind: Kind, obj: Value) -> Value {
        let info = of(kind);
        let mut v = normalize(info, &obj).expect("a well-formed object");
        apply(info, &mut v);
        v
    }

    fn pod_with(containers: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": containers}})
    }

    #[test]
    fn a_pod_gets_the_kubernetes_defaults() {
        let p = defaulted(
            Kind::Pod,
            pod_with(json!([{
                "name": "web", "image": "nginx:1.25",
                "ports": [{"containerPort": 80}],
                "livenessProbe": {"httpGet": {"port": 80}}
            }])),
        );
        let spec = &p["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["enableServiceLinks"], true);
        assert_eq!(spec["priority"], 0);
        assert!(spec.get("serviceAccountName").is_none());
        let c = &spec["containers"][0];
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"path": "/", "port": 80, "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10,
                   "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(p["status"], json!({"phase": "Pending", "qosClass": "BestEffort"}));
    }

    #[test]
    fn images_without_a_tag_or_tagged_latest_are_always_pulled() {
        for (image, policy) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.25", "IfNotPresent"),
            ("registry.local:5000/team/app", "Always"),
            ("registry.local:5000/team/app:v2", "IfNotPresent"),
            ("nginx@sha256:abcd", "IfNotPresent"),
            ("nginx:latest@sha256:abcd", "Always"),
        ] {
            let p = defaulted(Kind::Pod, pod_with(json!([{"name": "c", "image": image}])));
            assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], policy, "{image}");
        }
        let p = defaulted(Kind::Pod, pod_with(json!([{"name": "c", "image": "nginx", "imagePullPolicy": "Never"}])));
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Never");
    }

    #[test]
    fn the_qos_class_follows_requests_and_limits() {
        let qos = |resources: Value| {
            defaulted(Kind::Pod, pod_with(json!([{"name": "c", "image": "i", "resources": resources}])))["status"]
                ["qosClass"]
                .clone()
        };
        assert_eq!(qos(json!({})), "BestEffort");
        assert_eq!(qos(json!({"requests": {"cpu": "100m"}})), "Burstable");
        assert_eq!(
            qos(json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}})),
            "Guaranteed"
        );
        // Requests default to limits on pods, so limits alone are Guaranteed.
        assert_eq!(qos(json!({"limits": {"cpu": "1", "memory": "1Gi"}})), "Guaranteed");
        assert_eq!(qos(json!({"limits": {"cpu": "1"}})), "Burstable");
        let p =
            defaulted(Kind::Pod, pod_with(json!([{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}])));
        assert_eq!(p["spec"]["containers"][0]["resources"]["requests"], json!({"cpu": "1"}));
    }

    #[test]
    fn an_existing_pod_status_is_left_alone() {
        let mut p = pod_with(json!([{"name": "c", "image": "i"}]));
        p["status"] = json!({"phase": "Running"});
        assert_eq!(defaulted(Kind::Pod, p)["status"], json!({"phase": "Running"}));
    }

    #[test]
    fn a_service_gets_its_defaults_and_target_ports() {
        let s = defaulted(
            Kind::Service,
            json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {"ports": [{"port": 80}, {"port": 443, "targetPort": "https"}]}}),
        );
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(s["spec"]["internalTrafficPolicy"], "Cluster");
        assert!(s["spec"].get("externalTrafficPolicy").is_none());
        assert!(s["spec"].get("clusterIP").is_none());
        assert_eq!(s["spec"]["ports"][0], json!({"port": 80, "protocol": "TCP", "targetPort": 80}));
        assert_eq!(s["spec"]["ports"][1]["targetPort"], "https");
        let s = defaulted(
            Kind::Service,
            json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}),
        );
        assert_eq!(s["spec"]["externalTrafficPolicy"], "Cluster");
    }

    #[test]
    fn workloads_get_replicas_strategies_and_template_defaults() {
        let template =
            json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        let d = defaulted(
            Kind::Deployment,
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template}}),
        );
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        let tspec = &d["spec"]["template"]["spec"];
        assert_eq!(tspec["restartPolicy"], "Always");
        assert_eq!(tspec["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert!(tspec.get("enableServiceLinks").is_none(), "pod-only defaults stay off templates");
        assert!(d.get("status").is_none());

        let recreate = defaulted(
            Kind::Deployment,
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {"strategy": {"type": "Recreate"}, "template": template}}),
        );
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));

        let ds = defaulted(
            Kind::DaemonSet,
            json!({"metadata": {"name": "d", "namespace": "default"}, "spec": {"template": template}}),
        );
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
        );
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);

        let rs = defaulted(
            Kind::ReplicaSet,
            json!({"metadata": {"name": "r", "namespace": "default"}, "spec": {"template": template}}),
        );
        assert_eq!(rs["spec"]["replicas"], 1);
        assert_eq!(rs["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    }

    #[test]
    fn jobs_and_cron_jobs_get_the_batch_defaults() {
        let template = json!({"metadata": {"labels": {"app": "a"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}});
        let j = defaulted(
            Kind::Job,
            json!({"metadata": {"name": "j", "namespace": "default"}, "spec": {"template": template}}),
        );
        let spec = &j["spec"];
        assert_eq!((spec["completions"].clone(), spec["parallelism"].clone()), (json!(1), json!(1)));
        assert_eq!(spec["backoffLimit"], 6);
        assert_eq!(spec["completionMode"], "NonIndexed");
        assert_eq!(spec["suspend"], false);
        assert!(spec.get("manualSelector").is_none());
        assert_eq!(j["metadata"]["labels"], json!({"app": "a"}), "a job without labels takes its template's");
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Never");

        let work_queue = defaulted(
            Kind::Job,
            json!({"metadata": {"name": "j", "namespace": "default"}, "spec": {"parallelism": 3, "template": template}}),
        );
        assert!(work_queue["spec"].get("completions").is_none());

        let c = defaulted(
            Kind::CronJob,
            json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}}),
        );
        assert_eq!(c["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(c["spec"]["suspend"], false);
        assert_eq!(c["spec"]["successfulJobsHistoryLimit"], 3);
        assert_eq!(c["spec"]["failedJobsHistoryLimit"], 1);
        assert_eq!(c["spec"]["jobTemplate"]["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    }

    #[test]
    fn namespaces_and_secrets_get_their_defaults() {
        let ns = defaulted(Kind::Namespace, json!({"metadata": {"name": "team-a"}}));
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "team-a");
        let unnamed = defaulted(Kind::Namespace, json!({"metadata": {"generateName": "team-"}}));
        assert!(unnamed["metadata"].get("labels").is_none());
        let s = defaulted(Kind::Secret, json!({"metadata": {"name": "s", "namespace": "default"}}));
        assert_eq!(s["type"], "Opaque");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "b"}});
        assert_eq!(defaulted(Kind::ConfigMap, cm.clone()), cm);
    }

    #[test]
    fn defaulting_twice_changes_nothing() {
        let objects = [
            (
                Kind::Pod,
                pod_with(
                    json!([{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}, "readinessProbe": {"tcpSocket": {"port": 1}}}]),
                ),
            ),
            (
                Kind::Service,
                json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "sessionAffinity": "ClientIP", "ports": [{"port": 80}]}}),
            ),
            (
                Kind::Deployment,
                json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "v"}, {"name": "s", "secret": {"secretName": "x"}}]}}}}),
            ),
            (Kind::DaemonSet, json!({"metadata": {"name": "d"}, "spec": {}})),
            (Kind::Job, json!({"metadata": {"name": "j"}, "spec": {"template": {"metadata": {"labels": {"a": "b"}}}}})),
            (Kind::CronJob, json!({"metadata": {"name": "c"}, "spec": {"schedule": "@daily", "jobTemplate": {}}})),
            (Kind::Namespace, json!({"metadata": {"name": "n"}})),
            (Kind::Node, json!({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}})),
            (Kind::Endpoints, json!({"metadata": {"name": "e"}, "subsets": [{"ports": [{"port": 80}]}]})),
            (
                Kind::EndpointSlice,
                json!({"metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": [], "ports": [{"port": 80}]}),
            ),
            (
                Kind::LimitRange,
                json!({"metadata": {"name": "l"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "1Mi"}}]}}),
            ),
            (Kind::Secret, json!({"metadata": {"name": "s"}})),
            (Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1000})),
        ];
        for (kind, obj) in objects {
            let once = defaulted(kind, obj);
            let mut twice = once.clone();
            apply(of(kind), &mut twice);
            assert_eq!(once, twice, "{kind:?}");
            // And what defaulting writes has the typed shape.
            assert_eq!(normalize(of(kind), &once).expect("defaults decode"), once, "{kind:?}");
        }
    }

    #[test]
    fn volumes_without_a_source_become_empty_dirs() {
        let mut p = pod_with(json!([{"name": "c", "image": "i"}]));
        p["spec"]["volumes"] = json!([{"name": "scratch"}, {"name": "cfg", "configMap": {"name": "c"}}]);
        let p = defaulted(Kind::Pod, p);
        assert_eq!(p["spec"]["volumes"][0], json!({"name": "scratch", "emptyDir": {}}));
        assert_eq!(p["spec"]["volumes"][1]["configMap"]["defaultMode"], 420);
    }

    #[test]
    fn priority_classes_preempt_lower_priority_unless_told_never() {
        let pc = defaulted(Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1000}));
        assert_eq!(pc["preemptionPolicy"], "PreemptLowerPriority");
        let never = json!({"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"});
        assert_eq!(defaulted(Kind::PriorityClass, never)["preemptionPolicy"], "Never");
    }

    #[test]
    fn limit_ranges_default_container_limits_from_max_and_requests_from_min() {
        let lr = defaulted(
            Kind::LimitRange,
            json!({"metadata": {"name": "l"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "1Mi"}}]}}),
        );
        let item = &lr["spec"]["limits"][0];
        assert_eq!(item["default"], json!({"cpu": "2"}));
        assert_eq!(item["defaultRequest"], json!({"cpu": "2", "memory": "1Mi"}));
    }

    #[test]
    fn defaulting_leaves_malformed_objects_alone_without_panicking() {
        for kind in crate::resources::catalog().iter().map(|r| r.kind_id) {
            for mut v in
                [json!(null), json!([1]), json!({"spec": 5}), json!({"spec": {"containers": "x", "template": []}})]
            {
                apply(of(kind), &mut v);
            }
        }
    }
}
