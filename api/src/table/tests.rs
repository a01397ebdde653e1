use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::printers::{parse_time, D_NAME};
use super::*;
use crate::resources::{catalog, of, Kind};

fn now() -> DateTime<Utc> {
    parse_time("2024-05-01T12:00:00Z").expect("valid time")
}

/// The RFC 3339 time `secs` seconds before [`now`].
fn ago(secs: i64) -> String {
    (now() - chrono::Duration::seconds(secs)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

const DAY: i64 = 86400;

fn cells_of(kind: Kind, obj: &Value) -> Vec<Value> {
    cells(of(kind), obj, now())
}

fn running_pod_with_restarts() -> Value {
    json!({
        "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": ago(2 * DAY),
                     "labels": {"tier": "fe", "app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "nginx"}, {"name": "log"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.5",
            "podIPs": [{"ip": "10.0.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "nginx", "ready": true, "restartCount": 3, "state": {"running": {"startedAt": ago(300)}},
                 "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(300)}}},
                {"name": "log", "ready": true, "restartCount": 0, "state": {"running": {}}},
            ],
        },
    })
}

fn crash_looping_pod() -> Value {
    json!({
        "metadata": {"name": "web-2", "namespace": "prod", "creationTimestamp": ago(2 * DAY)},
        "spec": {"containers": [{"name": "nginx"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{
                "name": "nginx", "ready": false, "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(30)}},
            }],
        },
    })
}

#[test]
fn a_running_pod_shows_ready_containers_and_restarts_with_their_age() {
    assert_eq!(
        cells_of(Kind::Pod, &running_pod_with_restarts()),
        vec![
            json!("web-1"),
            json!("2/2"),
            json!("Running"),
            json!("3 (5m ago)"),
            json!("2d"),
            json!("10.0.0.5"),
            json!("node-1"),
            json!("<none>"),
            json!("<none>")
        ]
    );
}

#[test]
fn a_crash_looping_pod_shows_the_waiting_reason() {
    let c = cells_of(Kind::Pod, &crash_looping_pod());
    assert_eq!(&c[1..4], &[json!("0/1"), json!("CrashLoopBackOff"), json!("5 (30s ago)")]);
    assert_eq!(&c[5..7], &[json!("<none>"), json!("<none>")]);
}

#[test]
fn a_pod_being_deleted_is_terminating_unless_finished_or_lost() {
    let mut pod = running_pod_with_restarts();
    pod["metadata"]["deletionTimestamp"] = json!(ago(10));
    assert_eq!(cells_of(Kind::Pod, &pod)[2], json!("Terminating"));
    pod["status"]["reason"] = json!("NodeLost");
    assert_eq!(cells_of(Kind::Pod, &pod)[2], json!("Unknown"));
    let done = json!({"metadata": {"name": "j", "deletionTimestamp": ago(1)}, "status": {"phase": "Succeeded"}});
    assert_eq!(cells_of(Kind::Pod, &done)[2], json!("Succeeded"));
}

#[test]
fn init_containers_show_progress_and_failures() {
    let pod = |statuses: Value| {
        json!({
            "metadata": {"name": "p"},
            "spec": {"initContainers": [{"name": "a"}, {"name": "b"}], "containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "initContainerStatuses": statuses},
        })
    };
    let done = json!({"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
    let initializing = json!({"name": "b", "state": {"waiting": {"reason": "PodInitializing"}}});
    assert_eq!(cells_of(Kind::Pod, &pod(json!([done, initializing])))[2], json!("Init:1/2"));
    let failed = json!({"name": "a", "restartCount": 2, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}});
    let c = cells_of(Kind::Pod, &pod(json!([failed])));
    assert_eq!(&c[1..4], &[json!("0/1"), json!("Init:Error"), json!("2")]);
    let no_reason = json!({"name": "a", "state": {"terminated": {"exitCode": 2}}});
    assert_eq!(cells_of(Kind::Pod, &pod(json!([no_reason])))[2], json!("Init:ExitCode:2"));
    let backoff = json!({"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}});
    assert_eq!(cells_of(Kind::Pod, &pod(json!([backoff])))[2], json!("Init:CrashLoopBackOff"));
}

#[test]
fn sidecars_count_as_containers_once_started() {
    let pod = json!({
        "metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}], "containers": [{"name": "app"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}],
            "initContainerStatuses": [{"name": "proxy", "started": true, "ready": true, "restartCount": 1,
                                       "state": {"running": {}}}],
            "containerStatuses": [{"name": "app", "ready": true, "state": {"running": {}}}],
        },
    });
    let c = cells_of(Kind::Pod, &pod);
    assert_eq!(&c[1..4], &[json!("2/2"), json!("Running"), json!("1")]);
}

#[test]
fn a_finished_pod_shows_the_container_reason_and_a_completed_row_condition() {
    let pod = json!({
        "metadata": {"name": "job-x"},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
    });
    let t = table(of(Kind::Pod), &[pod], IncludeObject::None, now());
    assert_eq!(t["rows"][0]["cells"][2], json!("Completed"));
    assert_eq!(t["rows"][0]["conditions"][0]["type"], json!("Completed"));
    assert_eq!(t["rows"][0]["conditions"][0]["reason"], json!("Succeeded"));
    let signalled = json!({"metadata": {"name": "k"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "c", "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}});
    assert_eq!(cells_of(Kind::Pod, &signalled)[2], json!("Signal:9"));
}

#[test]
fn pods_report_scheduling_gates_and_readiness_gates() {
    let pod = json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}], "readinessGates": [{"conditionType": "a"}, {"conditionType": "b"}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"},
            {"type": "a", "status": "True"}, {"type": "b", "status": "False"}]},
    });
    let c = cells_of(Kind::Pod, &pod);
    assert_eq!(c[2], json!("SchedulingGated"));
    assert_eq!(c[8], json!("1/2"));
}

#[test]
fn a_cordoned_control_plane_node_shows_roles_and_scheduling_disabled() {
    let node = json!({
        "metadata": {"name": "node-1", "creationTimestamp": ago(30 * DAY),
                     "labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/etcd": "",
                                "kubernetes.io/role": "master"}},
        "spec": {"unschedulable": true},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
            "addresses": [{"type": "Hostname", "address": "node-1"}, {"type": "InternalIP", "address": "192.168.1.10"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "kernelVersion": "6.1.0-18-amd64", "containerRuntimeVersion": "containerd://1.7.13"},
        },
    });
    assert_eq!(
        cells_of(Kind::Node, &node),
        vec![
            json!("node-1"),
            json!("Ready,SchedulingDisabled"),
            json!("control-plane,etcd,master"),
            json!("30d"),
            json!("v1.32.0"),
            json!("192.168.1.10"),
            json!("<none>"),
            json!("Debian GNU/Linux 12 (bookworm)"),
            json!("6.1.0-18-amd64"),
            json!("containerd://1.7.13")
        ]
    );
}

#[test]
fn a_node_without_a_ready_condition_is_unknown() {
    let c = cells_of(Kind::Node, &json!({"metadata": {"name": "n"}}));
    assert_eq!(&c[1..3], &[json!("Unknown"), json!("<none>")]);
    assert_eq!(&c[7..], &[json!("<unknown>"), json!("<unknown>"), json!("<unknown>")]);
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    assert_eq!(cells_of(Kind::Node, &not_ready)[1], json!("NotReady"));
}

#[test]
fn namespaces_show_their_phase() {
    let ns = json!({"metadata": {"name": "prod", "creationTimestamp": ago(45)}, "status": {"phase": "Terminating"}});
    assert_eq!(cells_of(Kind::Namespace, &ns), vec![json!("prod"), json!("Terminating"), json!("45s")]);
}

#[test]
fn a_node_port_service_shows_node_ports_and_its_selector() {
    let svc = json!({
        "metadata": {"name": "web", "creationTimestamp": ago(3 * 3600)},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "selector": {"app": "web", "tier": "fe"},
                 "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP", "nodePort": 30053}]},
    });
    assert_eq!(
        cells_of(Kind::Service, &svc),
        vec![
            json!("web"),
            json!("NodePort"),
            json!("10.96.0.10"),
            json!("<none>"),
            json!("80:30080/TCP,53:30053/UDP"),
            json!("3h"),
            json!("app=web,tier=fe")
        ]
    );
}

#[test]
fn services_default_to_cluster_ip_and_load_balancers_wait_for_an_address() {
    let plain = json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}});
    let c = cells_of(Kind::Service, &plain);
    assert_eq!(&c[1..5], &[json!("ClusterIP"), json!("None"), json!("<none>"), json!("5432/TCP")]);
    assert_eq!(c[6], json!("<none>"));
    let lb = json!({"spec": {"type": "LoadBalancer", "externalIPs": ["1.2.3.4"]}});
    assert_eq!(cells_of(Kind::Service, &lb)[3], json!("1.2.3.4"));
    let pending = json!({"spec": {"type": "LoadBalancer"}});
    assert_eq!(cells_of(Kind::Service, &pending)[3], json!("<pending>"));
    assert_eq!(cells_of(Kind::Service, &pending)[4], json!("<none>"));
    let ready = json!({"spec": {"type": "LoadBalancer"},
                       "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}, {"hostname": "lb.example.com"}]}}});
    assert_eq!(cells_of(Kind::Service, &ready)[3], json!("5.6.7.8,lb.example.com"));
    let external = json!({"spec": {"type": "ExternalName", "externalName": "db.example.com"}});
    assert_eq!(cells_of(Kind::Service, &external)[3], json!("db.example.com"));
}

#[test]
fn endpoint_slices_show_address_type_ports_and_endpoints() {
    let slice = json!({
        "metadata": {"name": "web-abc12", "creationTimestamp": ago(90)},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}, {"name": "all"}],
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.3"]},
                      {"addresses": ["10.0.0.4"]}],
    });
    assert_eq!(
        cells_of(Kind::EndpointSlice, &slice),
        vec![
            json!("web-abc12"),
            json!("IPv4"),
            json!("8080,all"),
            json!("10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."),
            json!("90s")
        ]
    );
    let placeholder = json!({"metadata": {"name": "web-x"}, "addressType": "IPv4", "endpoints": []});
    assert_eq!(cells_of(Kind::EndpointSlice, &placeholder)[2..4], [json!("<unset>"), json!("<unset>")]);
    let names: Vec<&str> = columns(of(Kind::EndpointSlice)).iter().map(|c| c.name).collect();
    assert_eq!(names, ["Name", "AddressType", "Ports", "Endpoints", "Age"]);
}

#[test]
fn priority_classes_show_value_default_and_policy_after_the_age() {
    let pc = json!({
        "metadata": {"name": "high", "creationTimestamp": ago(90)},
        "value": 1000, "globalDefault": true, "preemptionPolicy": "Never",
    });
    assert_eq!(
        cells_of(Kind::PriorityClass, &pc),
        vec![json!("high"), json!(1000), json!(true), json!("90s"), json!("Never")]
    );
    let bare = json!({"metadata": {"name": "low", "creationTimestamp": ago(90)}, "value": -5});
    assert_eq!(cells_of(Kind::PriorityClass, &bare)[1..], [json!(-5), json!(false), json!("90s"), json!("<unset>")]);
    let names: Vec<&str> = columns(of(Kind::PriorityClass)).iter().map(|c| c.name).collect();
    assert_eq!(names, ["Name", "Value", "Global-Default", "Age", "PreemptionPolicy"]);
}

#[test]
fn endpoints_list_three_addresses_then_count_the_rest() {
    let ep = json!({
        "metadata": {"name": "web"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}, {"ip": "10.0.0.4"}],
                     "ports": [{"port": 80}]},
                    {"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 8080}]}],
    });
    assert_eq!(cells_of(Kind::Endpoints, &ep)[1], json!("10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 2 more..."));
    let v6 = json!({"subsets": [{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 80}]}]});
    assert_eq!(cells_of(Kind::Endpoints, &v6)[1], json!("[fd00::1]:80"));
    let headless = json!({"subsets": [{"addresses": [{"ip": "10.0.0.9"}]}]});
    assert_eq!(cells_of(Kind::Endpoints, &headless)[1], json!("10.0.0.9"));
    assert_eq!(cells_of(Kind::Endpoints, &json!({}))[1], json!("<none>"));
}

#[test]
fn config_maps_secrets_and_service_accounts_count_their_entries() {
    let cm = json!({"metadata": {"name": "cfg"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
    assert_eq!(cells_of(Kind::ConfigMap, &cm)[1], json!(3));
    let secret = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"password": "cGFzcw=="}});
    assert_eq!(&cells_of(Kind::Secret, &secret)[..3], &[json!("s"), json!("Opaque"), json!(1)]);
    let sa = json!({"metadata": {"name": "default"}, "secrets": [{"name": "default-token"}]});
    assert_eq!(&cells_of(Kind::ServiceAccount, &sa)[..2], &[json!("default"), json!(1)]);
}

#[test]
fn events_show_last_seen_the_object_and_the_source() {
    let ev = json!({
        "metadata": {"name": "web-1.17a2b", "namespace": "default", "creationTimestamp": ago(600)},
        "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{nginx}"},
        "reason": "BackOff", "type": "Warning", "message": "Back-off restarting failed container\n",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": ago(600), "lastTimestamp": ago(120), "count": 4,
    });
    assert_eq!(
        cells_of(Kind::Event, &ev),
        vec![
            json!("2m"),
            json!("Warning"),
            json!("BackOff"),
            json!("pod/web-1"),
            json!("spec.containers{nginx}"),
            json!("kubelet, node-1"),
            json!("Back-off restarting failed container"),
            json!("10m"),
            json!(4),
            json!("web-1.17a2b")
        ]
    );
}

#[test]
fn new_style_events_use_event_time_series_and_reporting_fields() {
    let ev = json!({
        "metadata": {"name": "e"},
        "involvedObject": {"kind": "Node"},
        "eventTime": "2024-05-01T11:59:00.123456Z",
        "reportingComponent": "skiff-scheduler",
        "series": {"count": 7, "lastObservedTime": "2024-05-01T11:59:50.000000Z"},
    });
    let c = cells_of(Kind::Event, &ev);
    assert_eq!(c[0], json!("10s"));
    assert_eq!(c[3], json!("node"));
    assert_eq!(c[5], json!("skiff-scheduler"));
    // 59.877s: truncated to whole seconds, as Go does.
    assert_eq!(&c[7..9], &[json!("59s"), json!(7)]);
    let single = json!({"metadata": {"name": "s"}, "firstTimestamp": ago(5)});
    let c = cells_of(Kind::Event, &single);
    assert_eq!((&c[0], &c[8]), (&json!("5s"), &json!(1)));
}

#[test]
fn leases_show_their_holder() {
    let lease = json!({"metadata": {"name": "kube-scheduler", "creationTimestamp": ago(90)},
                       "spec": {"holderIdentity": "node-1_4f2a"}});
    assert_eq!(cells_of(Kind::Lease, &lease), vec![json!("kube-scheduler"), json!("node-1_4f2a"), json!("90s")]);
    assert_eq!(cells_of(Kind::Lease, &json!({}))[1], json!(""));
}

#[test]
fn replica_sets_show_counts_and_their_template_when_wide() {
    let rs = json!({
        "metadata": {"name": "web-5d8f", "creationTimestamp": ago(DAY)},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d8f"}},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}, {"name": "log", "image": "busybox"}]}}},
        "status": {"replicas": 3, "readyReplicas": 2},
    });
    assert_eq!(
        cells_of(Kind::ReplicaSet, &rs),
        vec![
            json!("web-5d8f"),
            json!(3),
            json!(3),
            json!(2),
            json!("24h"),
            json!("nginx,log"),
            json!("nginx:1.26,busybox"),
            json!("app=web,pod-template-hash=5d8f")
        ]
    );
}

#[test]
fn replication_controllers_show_desired_current_ready_and_age() {
    let rc = json!({
        "metadata": {"name": "web", "creationTimestamp": ago(DAY)},
        "spec": {"replicas": 3, "selector": {"app": "web"},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}]}}},
        "status": {"replicas": 2, "readyReplicas": 1},
    });
    let names: Vec<&str> = columns(of(Kind::ReplicationController)).iter().map(|c| c.name).collect();
    assert_eq!(names, ["Name", "Desired", "Current", "Ready", "Age", "Containers", "Images", "Selector"]);
    assert_eq!(
        cells_of(Kind::ReplicationController, &rc),
        vec![
            json!("web"),
            json!(3),
            json!(2),
            json!(1),
            json!("24h"),
            json!("nginx"),
            json!("nginx:1.26"),
            json!("app=web")
        ]
    );
}

#[test]
fn a_deployment_mid_rollout_shows_ready_of_desired_and_up_to_date() {
    let d = json!({
        "metadata": {"name": "web", "creationTimestamp": ago(7 * DAY + 5 * 3600)},
        "spec": {"replicas": 3,
                 "selector": {"matchLabels": {"app": "web"},
                              "matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]},
                                                   {"key": "canary", "operator": "DoesNotExist"}]},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}]}}},
        "status": {"replicas": 4, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2},
    });
    assert_eq!(
        cells_of(Kind::Deployment, &d),
        vec![
            json!("web"),
            json!("2/3"),
            json!(1),
            json!(2),
            json!("7d5h"),
            json!("nginx"),
            json!("nginx:1.26"),
            json!("app=web,!canary,tier in (be,fe)")
        ]
    );
    let fresh = json!({"metadata": {"name": "new"}});
    assert_eq!(&cells_of(Kind::Deployment, &fresh)[1..4], &[json!("0/1"), json!(0), json!(0)]);
    assert_eq!(cells_of(Kind::Deployment, &fresh)[7], json!(""));
    let bad = json!({"spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}});
    assert_eq!(cells_of(Kind::Deployment, &bad)[7], json!("<invalid>"));
    assert_eq!(cells_of(Kind::ReplicaSet, &bad)[7], json!("<error>"));
}

#[test]
fn daemon_sets_show_scheduling_counts_and_node_selector() {
    let ds = json!({
        "metadata": {"name": "proxy", "creationTimestamp": ago(600)},
        "spec": {"selector": {"matchLabels": {"k8s-app": "proxy"}},
                 "template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                       "containers": [{"name": "proxy", "image": "proxy:v1"}]}}},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                   "updatedNumberScheduled": 3, "numberAvailable": 2},
    });
    assert_eq!(
        cells_of(Kind::DaemonSet, &ds),
        vec![
            json!("proxy"),
            json!(3),
            json!(3),
            json!(2),
            json!(3),
            json!(2),
            json!("kubernetes.io/os=linux"),
            json!("10m"),
            json!("proxy"),
            json!("proxy:v1"),
            json!("k8s-app=proxy")
        ]
    );
    assert_eq!(cells_of(Kind::DaemonSet, &json!({}))[6], json!("<none>"));
}

#[test]
fn jobs_show_status_completions_and_duration() {
    let complete = json!({
        "metadata": {"name": "pi", "creationTimestamp": ago(300)},
        "spec": {"completions": 1, "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "abc"}},
                 "template": {"spec": {"containers": [{"name": "pi", "image": "perl:5.34"}]}}},
        "status": {"succeeded": 1, "startTime": ago(290), "completionTime": ago(245),
                   "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]},
    });
    assert_eq!(
        cells_of(Kind::Job, &complete),
        vec![
            json!("pi"),
            json!("Complete"),
            json!("1/1"),
            json!("45s"),
            json!("5m"),
            json!("pi"),
            json!("perl:5.34"),
            json!("batch.kubernetes.io/controller-uid=abc")
        ]
    );
    let running = json!({"spec": {"parallelism": 3}, "status": {"startTime": ago(30), "succeeded": 1}});
    assert_eq!(&cells_of(Kind::Job, &running)[1..4], &[json!("Running"), json!("1/1 of 3"), json!("30s")]);
    let failed = json!({"spec": {"completions": 2}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}});
    assert_eq!(&cells_of(Kind::Job, &failed)[1..4], &[json!("Failed"), json!("0/2"), json!("")]);
    let suspended = json!({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}});
    assert_eq!(cells_of(Kind::Job, &suspended)[1], json!("Suspended"));
}

#[test]
fn cron_jobs_show_schedule_suspension_and_last_run() {
    let cj = json!({
        "metadata": {"name": "backup", "creationTimestamp": ago(2 * DAY)},
        "spec": {"schedule": "*/5 * * * *", "suspend": false,
                 "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "backup:2"}]}}}}},
        "status": {"active": [{"name": "backup-1"}], "lastScheduleTime": ago(180)},
    });
    assert_eq!(
        cells_of(Kind::CronJob, &cj),
        vec![
            json!("backup"),
            json!("*/5 * * * *"),
            json!("<none>"),
            json!("False"),
            json!(1),
            json!("3m"),
            json!("2d"),
            json!("b"),
            json!("backup:2"),
            json!("<none>")
        ]
    );
    let tz = json!({"spec": {"timeZone": "Europe/Oslo", "suspend": true}});
    assert_eq!(&cells_of(Kind::CronJob, &tz)[2..6], &[json!("Europe/Oslo"), json!("True"), json!(0), json!("<none>")]);
}

#[test]
fn resource_quotas_split_requests_from_limits() {
    let q = json!({
        "metadata": {"name": "compute", "creationTimestamp": ago(60)},
        "status": {"hard": {"pods": "10", "requests.cpu": "1", "limits.memory": "2Gi", "cpu": "2"},
                   "used": {"pods": "3", "requests.cpu": "500m", "cpu": "250m"}},
    });
    assert_eq!(
        cells_of(Kind::ResourceQuota, &q),
        vec![
            json!("compute"),
            json!("60s"),
            json!("cpu: 250m/2, pods: 3/10, requests.cpu: 500m/1"),
            json!("limits.memory: 0/2Gi")
        ]
    );
}

#[test]
fn limit_ranges_get_the_default_columns() {
    let lr = json!({"metadata": {"name": "limits", "creationTimestamp": "2024-04-30T10:00:00+02:00"}});
    assert_eq!(cells_of(Kind::LimitRange, &lr), vec![json!("limits"), json!("2024-04-30T08:00:00Z")]);
    let cols = columns(of(Kind::LimitRange));
    assert_eq!((cols[1].name, cols[1].type_), ("Created At", "date"));
}

#[test]
fn every_kind_has_one_cell_per_column_even_for_empty_objects() {
    for info in catalog() {
        let cols = columns(info);
        for obj in [json!({}), json!(null), json!("x"), json!({"metadata": 5, "spec": [], "status": "?"})] {
            assert_eq!(cells(info, &obj, now()).len(), cols.len(), "{}", info.kind);
        }
        let first = if info.kind_id == Kind::Event { 9 } else { 0 };
        assert_eq!((cols[first].name, cols[first].format), ("Name", "name"), "{}", info.kind);
        assert_eq!(cols.iter().filter(|c| c.format == "name").count(), 1, "{}", info.kind);
    }
}

#[test]
fn wide_columns_are_those_kubectl_hides_by_default() {
    let wide_names = |k: Kind| columns(of(k)).iter().filter(|c| c.priority == 1).map(|c| c.name).collect::<Vec<_>>();
    assert_eq!(wide_names(Kind::Pod), ["IP", "Node", "Nominated Node", "Readiness Gates"]);
    assert_eq!(
        wide_names(Kind::Node),
        ["Internal-IP", "External-IP", "OS-Image", "Kernel-Version", "Container-Runtime"]
    );
    assert_eq!(wide_names(Kind::Event), ["Subobject", "Source", "First Seen", "Count", "Name"]);
    assert_eq!(wide_names(Kind::Deployment), ["Containers", "Images", "Selector"]);
    assert_eq!(wide_names(Kind::ReplicationController), ["Containers", "Images", "Selector"]);
    assert_eq!(wide_names(Kind::Service), ["Selector"]);
    assert!(wide_names(Kind::ConfigMap).is_empty());
}

#[test]
fn the_table_has_the_meta_v1_shape_and_rows_carry_what_was_asked() {
    let pod = running_pod_with_restarts();
    let t = table(of(Kind::Pod), std::slice::from_ref(&pod), IncludeObject::None, now());
    assert_eq!(t["kind"], json!("Table"));
    assert_eq!(t["apiVersion"], json!("meta.k8s.io/v1"));
    assert_eq!(t["metadata"], json!({}));
    assert_eq!(
        t["columnDefinitions"][0],
        json!({"name": "Name", "type": "string", "format": "name", "description": D_NAME, "priority": 0})
    );
    assert_eq!(t["columnDefinitions"][5]["priority"], json!(1));
    assert!(t["rows"][0].get("object").is_none());
    assert!(t["rows"][0].get("conditions").is_none());

    let t = table(of(Kind::Pod), std::slice::from_ref(&pod), IncludeObject::Metadata, now());
    assert_eq!(
        t["rows"][0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": pod["metadata"]})
    );
    let t = table(of(Kind::Pod), std::slice::from_ref(&pod), IncludeObject::Object, now());
    assert_eq!(t["rows"][0]["object"], pod);
    let empty = table(of(Kind::Pod), &[], IncludeObject::Metadata, now());
    assert_eq!(empty["rows"], json!([]));
}

#[test]
fn include_object_parses_the_query_parameter() {
    assert_eq!(IncludeObject::from_param(Some("None")), IncludeObject::None);
    assert_eq!(IncludeObject::from_param(Some("Object")), IncludeObject::Object);
    assert_eq!(IncludeObject::from_param(None), IncludeObject::Metadata);
}

fn pods_table() -> Value {
    table(of(Kind::Pod), &[running_pod_with_restarts(), crash_looping_pod()], IncludeObject::Metadata, now())
}

#[test]
fn render_aligns_columns_like_kubectl() {
    let expected = "\
NAME    READY   STATUS             RESTARTS      AGE
web-1   2/2     Running            3 (5m ago)    2d
web-2   0/1     CrashLoopBackOff   5 (30s ago)   2d
";
    assert_eq!(render(&pods_table(), RenderOptions::default()), expected);
}

#[test]
fn render_wide_adds_the_priority_columns() {
    let expected = "\
NAME    READY   STATUS             RESTARTS      AGE   IP         NODE     NOMINATED NODE   READINESS GATES
web-1   2/2     Running            3 (5m ago)    2d    10.0.0.5   node-1   <none>           <none>
web-2   0/1     CrashLoopBackOff   5 (30s ago)   2d    <none>     <none>   <none>           <none>
";
    assert_eq!(render(&pods_table(), RenderOptions { wide: true, ..Default::default() }), expected);
}

#[test]
fn render_namespace_column_and_labels_come_from_row_metadata() {
    let expected = "\
NAMESPACE   NAME    READY   STATUS             RESTARTS      AGE   LABELS
default     web-1   2/2     Running            3 (5m ago)    2d    app=web,tier=fe
prod        web-2   0/1     CrashLoopBackOff   5 (30s ago)   2d    <none>
";
    let options = RenderOptions { namespace_column: true, show_labels: true, ..Default::default() };
    assert_eq!(render(&pods_table(), options), expected);
}

#[test]
fn render_without_headers_keeps_kubectls_minimum_width() {
    let cms = [json!({"metadata": {"name": "a", "creationTimestamp": ago(5)}, "data": {"k": "v"}})];
    let t = table(of(Kind::ConfigMap), &cms, IncludeObject::None, now());
    assert_eq!(render(&t, RenderOptions { no_headers: true, ..Default::default() }), "a     1     5s\n");
    assert_eq!(render(&t, RenderOptions::default()), "NAME   DATA   AGE\na      1      5s\n");
}

#[test]
fn render_of_events_upper_cases_multi_word_headers() {
    let ev = json!({"metadata": {"name": "e1"}, "type": "Normal", "reason": "Scheduled",
                    "involvedObject": {"kind": "Pod", "name": "web-1"}, "message": "Successfully assigned",
                    "lastTimestamp": ago(65)});
    let t = table(of(Kind::Event), &[ev], IncludeObject::None, now());
    let expected = "\
LAST SEEN   TYPE     REASON      OBJECT      MESSAGE
65s         Normal   Scheduled   pod/web-1   Successfully assigned
";
    assert_eq!(render(&t, RenderOptions::default()), expected);
}

#[test]
fn render_of_no_rows_is_empty_and_bad_tables_do_not_panic() {
    let empty = table(of(Kind::Pod), &[], IncludeObject::None, now());
    assert_eq!(render(&empty, RenderOptions::default()), "");
    assert_eq!(render(&json!(null), RenderOptions::default()), "");
    // Rows without objects: no namespace, no labels; cells beyond the
    // columns ignored.
    let odd = json!({"columnDefinitions": [{"name": "Name"}], "rows": [{"cells": ["a", "extra"]}, {"cells": []}]});
    let options = RenderOptions { namespace_column: true, show_labels: true, ..Default::default() };
    assert_eq!(render(&odd, options), "NAMESPACE   NAME   LABELS\n            a\n\n");
}

#[test]
fn disruption_budgets_show_their_bounds_and_allowed_disruptions() {
    let pdb = json!({
        "metadata": {"name": "web", "creationTimestamp": ago(90)},
        "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 2},
    });
    assert_eq!(
        cells_of(Kind::PodDisruptionBudget, &pdb),
        vec![json!("web"), json!("50%"), json!("N/A"), json!(2), json!("90s")]
    );
    let fresh = json!({"metadata": {"name": "api", "creationTimestamp": ago(90)}, "spec": {"maxUnavailable": 1}});
    assert_eq!(cells_of(Kind::PodDisruptionBudget, &fresh)[1..4], [json!("N/A"), json!("1"), json!(0)]);
    let names: Vec<&str> = columns(of(Kind::PodDisruptionBudget)).iter().map(|c| c.name).collect();
    assert_eq!(names, ["Name", "Min Available", "Max Unavailable", "Allowed Disruptions", "Age"]);
}
