//! The columns `get` shows per kind, as a `meta.k8s.io/v1` Table, and the
//! text rendering of a Table the way kubectl prints it.
//!
//! [`table`] answers `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
//! the way the Kubernetes 1.32 apiserver does: the column definitions and the
//! cell values are those of `pkg/printers/internalversion/printers.go`. Like
//! the apiserver, the cells always include the priority-1 (`-o wide`)
//! columns; it is the client that hides them. Kinds without a printer there
//! (LimitRange) get the apiserver's default columns, `Name` and `Created At`.
//!
//! Objects are read as JSON and may lack any field; a missing field reads as
//! the value Kubernetes' defaulting would have given it (one replica, type
//! `ClusterIP`, protocol `TCP`, ...), so a stored object and its defaulted
//! form print the same.
//!
//! [`render`] prints a Table as `kubectl get` does: upper-case headers, cells
//! aligned by a tabwriter with kubectl's settings (minimum width 6, padding
//! 3), wide columns only with `-o wide`, optional NAMESPACE and LABELS
//! columns read from each row's object metadata.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::meta;
use crate::resources::{Kind, ResourceInfo};

/// What each row carries besides its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    /// The `includeObject` query parameter (`None`, `Metadata`, `Object`);
    /// Kubernetes' default, `Metadata`, when absent or unknown.
    pub fn from_param(param: Option<&str>) -> IncludeObject {
        match param {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// One `TableColumnDefinition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    /// An OpenAPI type: `string`, `integer`, `boolean`, `date`.
    pub type_: &'static str,
    /// `name` for the column holding the object's name, else empty.
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for the columns `get` shows; 1 for those only `-o wide` shows.
    pub priority: i32,
}

impl Column {
    /// The JSON form, every field present as the apiserver writes it.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

const fn col(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 0 }
}

const fn wide(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 1 }
}

// Descriptions: the Swagger docs the Kubernetes printers reference.
const D_NAME: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const D_AGE: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const D_CONTAINERS: &str = "Names of each container in the template.";
const D_IMAGES: &str = "Images referenced by each container in the template.";
const D_READY_PODS: &str = "Number of the pod with ready state";

const NAME: Column = Column { name: "Name", type_: "string", format: "name", description: D_NAME, priority: 0 };
const AGE: Column = col("Age", "string", D_AGE);
const CONTAINERS: Column = wide("Containers", "string", D_CONTAINERS);
const IMAGES: Column = wide("Images", "string", D_IMAGES);

static POD: [Column; 9] = [
    NAME,
    col("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
    col("Status", "string", "The aggregate status of the containers in this pod."),
    col(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    wide("IP", "string", "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated."),
    wide("Node", "string", "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename"),
    wide("Nominated Node", "string", "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled."),
    wide("Readiness Gates", "string", "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates"),
];

const D_NODE_ADDRESSES: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";

static NODE: [Column; 10] = [
    NAME,
    col("Status", "string", "The status of the node"),
    col("Roles", "string", "The roles of the node"),
    AGE,
    col("Version", "string", "Kubelet Version reported by the node."),
    wide("Internal-IP", "string", D_NODE_ADDRESSES),
    wide("External-IP", "string", D_NODE_ADDRESSES),
    wide(
        "OS-Image",
        "string",
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    ),
    wide(
        "Kernel-Version",
        "string",
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    ),
    wide(
        "Container-Runtime",
        "string",
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    ),
];

static NAMESPACE: [Column; 3] = [NAME, col("Status", "string", "The status of the namespace"), AGE];

static SERVICE: [Column; 7] = [
    NAME,
    col("Type", "string", "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types"),
    col("Cluster-IP", "string", "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
    col("External-IP", "string", "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system."),
    col("Port(s)", "string", "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
    AGE,
    wide("Selector", "string", "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/"),
];

static ENDPOINTS: [Column; 3] = [
    NAME,
    col("Endpoints", "string", "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service."),
    AGE,
];

static CONFIG_MAP: [Column; 3] = [
    NAME,
    col("Data", "string", "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process."),
    AGE,
];

static SECRET: [Column; 4] = [
    NAME,
    col("Type", "string", "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types"),
    col("Data", "string", "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4"),
    AGE,
];

static SERVICE_ACCOUNT: [Column; 3] = [
    NAME,
    col("Secrets", "string", "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use. Pods are only limited to this list if this service account has a \"kubernetes.io/enforce-mountable-secrets\" annotation set to \"true\". The \"kubernetes.io/enforce-mountable-secrets\" annotation is deprecated since v1.32. Prefer separate namespaces to isolate access to mounted secrets. This field should not be used to find auto-generated service account token secrets for use outside of pods. Instead, tokens can be requested directly using the TokenRequest API, or service account token secrets can be manually created. More info: https://kubernetes.io/docs/concepts/configuration/secret"),
    AGE,
];

static EVENT: [Column; 10] = [
    col("Last Seen", "string", "The time at which the most recent occurrence of this event was recorded."),
    col("Type", "string", "Type of this event (Normal, Warning), new types could be added in the future"),
    col("Reason", "string", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
    col("Object", "string", "The object that this event is about."),
    wide("Subobject", "string", "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object."),
    wide("Source", "string", "The component reporting this event. Should be a short machine understandable string."),
    col("Message", "string", "A human-readable description of the status of this operation."),
    wide("First Seen", "string", "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
    wide("Count", "string", "The number of times this event has occurred."),
    Column { name: "Name", type_: "string", format: "name", description: D_NAME, priority: 1 },
];

static LEASE: [Column; 3] = [
    NAME,
    col("Holder", "string", "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field."),
    AGE,
];

static REPLICA_SET: [Column; 8] = [
    NAME,
    col("Desired", "integer", "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller"),
    col("Current", "integer", "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/#what-is-a-replicationcontroller"),
    col("Ready", "integer", "readyReplicas is the number of pods targeted by this ReplicaSet with a Ready Condition."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

static DEPLOYMENT: [Column; 8] = [
    NAME,
    col("Ready", "string", D_READY_PODS),
    col("Up-to-date", "string", "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
    col("Available", "string", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels."),
];

static DAEMON_SET: [Column; 11] = [
    NAME,
    col("Desired", "integer", "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
    col("Current", "integer", "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
    col("Ready", "integer", "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
    col("Up-to-date", "integer", "The total number of nodes that are running updated daemon pod"),
    col("Available", "integer", "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
    col("Node Selector", "string", "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/"),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

const D_JOB_SELECTOR: &str = "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors";

static JOB: [Column; 8] = [
    NAME,
    col("Status", "string", "Status of the job."),
    col("Completions", "string", "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs."),
    col("Duration", "string", "Time required to complete the job."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

static CRON_JOB: [Column; 10] = [
    NAME,
    col("Schedule", "string", "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
    col("Timezone", "string", "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones"),
    col("Suspend", "boolean", "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false."),
    col("Active", "integer", "A list of pointers to currently running jobs."),
    col("Last Schedule", "string", "Information when was the last time the job was successfully scheduled."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", D_JOB_SELECTOR),
];

static RESOURCE_QUOTA: [Column; 4] = [
    NAME,
    AGE,
    col("Request", "string", "Request represents a minimum amount of cpu/memory that a container may consume."),
    col("Limit", "string", "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node."),
];

/// The apiserver's default columns, for kinds without a printer.
static DEFAULT: [Column; 2] = [NAME, col("Created At", "date", D_AGE)];

/// The column definitions of `info`'s kind, wide ones included.
pub fn columns(info: &ResourceInfo) -> &'static [Column] {
    match info.kind_id {
        Kind::Pod => &POD,
        Kind::Node => &NODE,
        Kind::Namespace => &NAMESPACE,
        Kind::Service => &SERVICE,
        Kind::Endpoints => &ENDPOINTS,
        Kind::ConfigMap => &CONFIG_MAP,
        Kind::Secret => &SECRET,
        Kind::ServiceAccount => &SERVICE_ACCOUNT,
        Kind::Event => &EVENT,
        Kind::Lease => &LEASE,
        Kind::ReplicaSet => &REPLICA_SET,
        Kind::Deployment => &DEPLOYMENT,
        Kind::DaemonSet => &DAEMON_SET,
        Kind::Job => &JOB,
        Kind::CronJob => &CRON_JOB,
        Kind::ResourceQuota => &RESOURCE_QUOTA,
        Kind::LimitRange => &DEFAULT,
    }
}

/// A Table of `objects` (all of `info`'s kind) at `now`.
pub fn table(info: &ResourceInfo, objects: &[Value], include: IncludeObject, now: DateTime<Utc>) -> Value {
    let columns: Vec<Value> = columns(info).iter().map(Column::to_json).collect();
    let rows: Vec<Value> = objects.iter().map(|o| row(info, o, include, now)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// One `TableRow` of `obj`: its cells, its row conditions (a finished pod
/// has one) and, as `include` says, the object or its metadata.
pub fn row(info: &ResourceInfo, obj: &Value, include: IncludeObject, now: DateTime<Utc>) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells(info, obj, now)));
    if info.kind_id == Kind::Pod {
        if let Some(conditions) = pod_row_conditions(obj) {
            row.insert("conditions".into(), conditions);
        }
    }
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            let metadata = obj.get("metadata").filter(|m| m.is_object()).cloned().unwrap_or_else(|| json!({}));
            row.insert(
                "object".into(),
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}),
            );
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj.clone());
        }
    }
    Value::Object(row)
}

/// The cells of `obj`'s row, one per column of [`columns`].
pub fn cells(info: &ResourceInfo, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = Value::from(meta::name(obj).unwrap_or(""));
    let age = Value::from(meta::age(obj, now));
    match info.kind_id {
        Kind::Pod => pod_cells(obj, name, age, now),
        Kind::Node => node_cells(obj, name, age),
        Kind::Namespace => vec![name, str_at(obj, "/status/phase").into(), age],
        Kind::Service => service_cells(obj, name, age),
        Kind::Endpoints => vec![name, format_endpoints(obj).into(), age],
        Kind::ConfigMap => {
            let n = obj_len(obj, "/data") + obj_len(obj, "/binaryData");
            vec![name, n.into(), age]
        }
        Kind::Secret => {
            vec![name, str_at(obj, "/type").into(), obj_len(obj, "/data").into(), age]
        }
        Kind::ServiceAccount => vec![name, arr_at(obj, "/secrets").len().into(), age],
        Kind::Event => event_cells(obj, name, now),
        Kind::Lease => vec![name, str_at(obj, "/spec/holderIdentity").into(), age],
        Kind::ReplicaSet => {
            let (names, images) = container_cells(obj, "/spec/template/spec/containers");
            vec![
                name,
                int_or(obj, "/spec/replicas", 1).into(),
                int_at(obj, "/status/replicas").into(),
                int_at(obj, "/status/readyReplicas").into(),
                age,
                names.into(),
                images.into(),
                format_label_selector(obj.pointer("/spec/selector")).into(),
            ]
        }
        Kind::Deployment => {
            let (names, images) = container_cells(obj, "/spec/template/spec/containers");
            let selector = match selector_string(obj.pointer("/spec/selector")) {
                Ok(s) => s,
                Err(()) => "<invalid>".into(),
            };
            let ready = format!("{}/{}", int_at(obj, "/status/readyReplicas"), int_or(obj, "/spec/replicas", 1));
            vec![
                name,
                ready.into(),
                int_at(obj, "/status/updatedReplicas").into(),
                int_at(obj, "/status/availableReplicas").into(),
                age,
                names.into(),
                images.into(),
                selector.into(),
            ]
        }
        Kind::DaemonSet => {
            let (names, images) = container_cells(obj, "/spec/template/spec/containers");
            vec![
                name,
                int_at(obj, "/status/desiredNumberScheduled").into(),
                int_at(obj, "/status/currentNumberScheduled").into(),
                int_at(obj, "/status/numberReady").into(),
                int_at(obj, "/status/updatedNumberScheduled").into(),
                int_at(obj, "/status/numberAvailable").into(),
                format_labels(obj.pointer("/spec/template/spec/nodeSelector")).into(),
                age,
                names.into(),
                images.into(),
                format_label_selector(obj.pointer("/spec/selector")).into(),
            ]
        }
        Kind::Job => job_cells(obj, name, age, now),
        Kind::CronJob => {
            let last = match time_at(obj, "/status/lastScheduleTime") {
                Some(t) => since(Some(t), now),
                None => "<none>".into(),
            };
            let time_zone = obj.pointer("/spec/timeZone").and_then(Value::as_str).unwrap_or("<none>");
            let suspend = if bool_at(obj, "/spec/suspend") { "True" } else { "False" };
            let (names, images) = container_cells(obj, "/spec/jobTemplate/spec/template/spec/containers");
            vec![
                name,
                str_at(obj, "/spec/schedule").into(),
                time_zone.into(),
                suspend.into(),
                arr_at(obj, "/status/active").len().into(),
                last.into(),
                age,
                names.into(),
                images.into(),
                format_label_selector(obj.pointer("/spec/jobTemplate/spec/selector")).into(),
            ]
        }
        Kind::ResourceQuota => {
            let (request, limit) = quota_columns(obj);
            vec![name, age, request.into(), limit.into()]
        }
        Kind::LimitRange => vec![name, created_at(obj).into()],
    }
}

// ---- reading fields -------------------------------------------------------

fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn int_at(obj: &Value, ptr: &str) -> i64 {
    int_or(obj, ptr, 0)
}

fn int_or(obj: &Value, ptr: &str, default: i64) -> i64 {
    obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(default)
}

fn bool_at(obj: &Value, ptr: &str) -> bool {
    obj.pointer(ptr).and_then(Value::as_bool).unwrap_or(false)
}

fn arr_at<'a>(obj: &'a Value, ptr: &str) -> &'a [Value] {
    obj.pointer(ptr).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

fn obj_len(obj: &Value, ptr: &str) -> usize {
    obj.pointer(ptr).and_then(Value::as_object).map_or(0, Map::len)
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&Utc))
}

fn time_at(obj: &Value, ptr: &str) -> Option<DateTime<Utc>> {
    obj.pointer(ptr).and_then(Value::as_str).and_then(parse_time)
}

/// Time since `t` as kubectl prints it; `<unknown>` for no time.
fn since(t: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match t {
        Some(t) => meta::human_duration((now - t).num_seconds()),
        None => "<unknown>".into(),
    }
}

/// `Created At` of the apiserver's default table: the creation time in
/// RFC 3339, UTC.
fn created_at(obj: &Value) -> String {
    let t = obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(parse_time);
    match t {
        Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        // Go's zero time, which the apiserver prints for a missing one.
        None => "0001-01-01T00:00:00Z".into(),
    }
}

/// `labels.FormatLabels`: `a=1,b=2` sorted by key, `<none>` if empty.
fn format_labels(map: Option<&Value>) -> String {
    let sorted: BTreeMap<&str, &str> = map
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap_or(""))).collect())
        .unwrap_or_default();
    if sorted.is_empty() {
        return "<none>".into();
    }
    sorted.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// `metav1.LabelSelectorAsSelector(sel).String()`: the requirements sorted
/// by key, `""` for a missing or empty selector; `Err` for an invalid one.
fn selector_string(sel: Option<&Value>) -> Result<String, ()> {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        return Ok(String::new());
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().ok_or(())?)));
        }
    }
    for expr in sel.get("matchExpressions").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
        let key = expr.get("key").and_then(Value::as_str).ok_or(())?;
        let mut values: Vec<&str> = expr
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        values.sort_unstable();
        let op = expr.get("operator").and_then(Value::as_str).unwrap_or("");
        let text = match op {
            "In" | "NotIn" if values.is_empty() => return Err(()),
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" | "DoesNotExist" if !values.is_empty() => return Err(()),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return Err(()),
        };
        reqs.push((key.to_string(), text));
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(reqs.into_iter().map(|(_, t)| t).collect::<Vec<_>>().join(","))
}

/// `metav1.FormatLabelSelector`: as [`selector_string`], `<none>` when
/// empty, `<error>` when invalid.
fn format_label_selector(sel: Option<&Value>) -> String {
    match selector_string(sel) {
        Ok(s) if s.is_empty() => "<none>".into(),
        Ok(s) => s,
        Err(()) => "<error>".into(),
    }
}

/// The container names and images of a pod template, comma-separated.
fn container_cells(obj: &Value, ptr: &str) -> (String, String) {
    let containers = arr_at(obj, ptr);
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, "/name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, "/image")).collect();
    (names.join(","), images.join(","))
}

// ---- pods -----------------------------------------------------------------

fn pod_row_conditions(pod: &Value) -> Option<Value> {
    let (reason, message) = match str_at(pod, "/status/phase") {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

fn has_condition(obj: &Value, ptr: &str, type_: &str) -> bool {
    arr_at(obj, ptr).iter().any(|c| str_at(c, "/type") == type_ && str_at(c, "/status") == "True")
}

fn last_termination(status: &Value) -> Option<DateTime<Utc>> {
    time_at(status, "/lastState/terminated/finishedAt")
}

/// The kubectl status reason of a terminated container: its reason, else
/// its signal, else its exit code.
fn terminated_reason(terminated: &Value, prefix: &str) -> String {
    let reason = str_at(terminated, "/reason");
    if !reason.is_empty() {
        return format!("{prefix}{reason}");
    }
    let signal = int_at(terminated, "/signal");
    if signal != 0 {
        format!("{prefix}Signal:{signal}")
    } else {
        format!("{prefix}ExitCode:{}", int_at(terminated, "/exitCode"))
    }
}

fn pod_cells(pod: &Value, name: Value, age: Value, now: DateTime<Utc>) -> Vec<Value> {
    let containers = arr_at(pod, "/spec/containers");
    let init_containers = arr_at(pod, "/spec/initContainers");
    let restartable: BTreeSet<&str> = init_containers
        .iter()
        .filter(|c| str_at(c, "/restartPolicy") == "Always")
        .map(|c| str_at(c, "/name"))
        .collect();
    // Sidecars (restartable init containers) count as containers.
    let total = containers.len() + init_containers.iter().filter(|c| str_at(c, "/restartPolicy") == "Always").count();

    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut ready = 0usize;
    let mut last_restart: Option<DateTime<Utc>> = None;
    let mut last_sidecar_restart: Option<DateTime<Utc>> = None;

    let phase = str_at(pod, "/status/phase");
    let mut reason = phase.to_string();
    let status_reason = str_at(pod, "/status/reason");
    if !status_reason.is_empty() {
        reason = status_reason.to_string();
    }
    for c in arr_at(pod, "/status/conditions") {
        if str_at(c, "/type") == "PodScheduled" && str_at(c, "/reason") == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }

    let mut initializing = false;
    for (i, status) in arr_at(pod, "/status/initContainerStatuses").iter().enumerate() {
        let count = int_at(status, "/restartCount");
        restarts += count;
        let finished = last_termination(status);
        last_restart = last_restart.max(finished);
        let is_sidecar = restartable.contains(str_at(status, "/name"));
        if is_sidecar {
            sidecar_restarts += count;
            last_sidecar_restart = last_sidecar_restart.max(finished);
        }
        let terminated = status.pointer("/state/terminated").filter(|t| t.is_object());
        let waiting_reason = str_at(status, "/state/waiting/reason");
        if terminated.is_some_and(|t| int_at(t, "/exitCode") == 0) {
            continue;
        }
        if is_sidecar && bool_at(status, "/started") {
            if bool_at(status, "/ready") {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = terminated_reason(t, "Init:");
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }

    if !initializing || has_condition(pod, "/status/conditions", "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for status in arr_at(pod, "/status/containerStatuses").iter().rev() {
            restarts += int_at(status, "/restartCount");
            last_restart = last_restart.max(last_termination(status));
            let waiting_reason = str_at(status, "/state/waiting/reason");
            let terminated = status.pointer("/state/terminated").filter(|t| t.is_object());
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = terminated_reason(t, "");
            } else if bool_at(status, "/ready") && status.pointer("/state/running").is_some_and(Value::is_object) {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if has_condition(pod, "/status/conditions", "Ready") { "Running" } else { "NotReady" }.into();
        }
    }

    if meta::deletion_timestamp(pod).is_some() {
        if status_reason == "NodeLost" {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }

    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t), now)),
        _ => restarts.to_string(),
    };

    let ip = arr_at(pod, "/status/podIPs")
        .first()
        .map(|p| str_at(p, "/ip"))
        .filter(|ip| !ip.is_empty())
        .unwrap_or_else(|| str_at(pod, "/status/podIP"));
    let gates = arr_at(pod, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = arr_at(pod, "/status/conditions");
        let true_count = gates
            .iter()
            .filter(|g| {
                let type_ = str_at(g, "/conditionType");
                conditions.iter().find(|c| str_at(c, "/type") == type_).is_some_and(|c| str_at(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };

    vec![
        name,
        format!("{ready}/{total}").into(),
        reason.into(),
        restarts.into(),
        age,
        or_none(ip).into(),
        or_none(str_at(pod, "/spec/nodeName")).into(),
        or_none(str_at(pod, "/status/nominatedNodeName")).into(),
        readiness_gates.into(),
    ]
}

fn or_none(s: &str) -> &str {
    if s.is_empty() {
        "<none>"
    } else {
        s
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "<unknown>"
    } else {
        s
    }
}

// ---- nodes ----------------------------------------------------------------

fn node_cells(node: &Value, name: Value, age: Value) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    // The last Ready condition wins, as in the printer's condition map.
    if let Some(ready) = arr_at(node, "/status/conditions").iter().rev().find(|c| str_at(c, "/type") == "Ready") {
        status.push(if str_at(ready, "/status") == "True" { "Ready" } else { "NotReady" }.into());
    }
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if bool_at(node, "/spec/unschedulable") {
        status.push("SchedulingDisabled".into());
    }

    let mut roles = BTreeSet::new();
    for (k, v) in meta::labels(node) {
        if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
            if !role.is_empty() {
                roles.insert(role.to_string());
            }
        } else if k == "kubernetes.io/role" && !v.is_empty() {
            roles.insert(v);
        }
    }
    let roles = if roles.is_empty() { "<none>".to_string() } else { roles.into_iter().collect::<Vec<_>>().join(",") };

    let address = |type_: &str| {
        arr_at(node, "/status/addresses")
            .iter()
            .find(|a| str_at(a, "/type") == type_)
            .map_or("<none>", |a| str_at(a, "/address"))
            .to_string()
    };
    vec![
        name,
        status.join(",").into(),
        roles.into(),
        age,
        str_at(node, "/status/nodeInfo/kubeletVersion").into(),
        address("InternalIP").into(),
        address("ExternalIP").into(),
        or_unknown(str_at(node, "/status/nodeInfo/osImage")).into(),
        or_unknown(str_at(node, "/status/nodeInfo/kernelVersion")).into(),
        or_unknown(str_at(node, "/status/nodeInfo/containerRuntimeVersion")).into(),
    ]
}

// ---- services and endpoints -----------------------------------------------

fn service_cells(svc: &Value, name: Value, age: Value) -> Vec<Value> {
    let type_ = obj_str_or(svc, "/spec/type", "ClusterIP");
    let cluster_ip = arr_at(svc, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| str_at(svc, "/spec/clusterIP"));
    let external_ips: Vec<&str> = arr_at(svc, "/spec/externalIPs").iter().filter_map(Value::as_str).collect();
    let external = match type_ {
        "ClusterIP" | "NodePort" if external_ips.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external_ips.join(","),
        "LoadBalancer" => {
            // The apiserver prints wide, so the list is never clipped.
            let lb: BTreeSet<&str> = arr_at(svc, "/status/loadBalancer/ingress")
                .iter()
                .map(|i| if str_at(i, "/ip").is_empty() { str_at(i, "/hostname") } else { str_at(i, "/ip") })
                .filter(|s| !s.is_empty())
                .collect();
            let mut all: Vec<&str> = lb.into_iter().collect();
            all.extend(external_ips);
            if all.is_empty() {
                "<pending>".to_string()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => str_at(svc, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    };
    let ports: Vec<String> = arr_at(svc, "/spec/ports")
        .iter()
        .map(|p| {
            let port = int_at(p, "/port");
            let protocol = obj_str_or(p, "/protocol", "TCP");
            match int_at(p, "/nodePort") {
                n if n > 0 => format!("{port}:{n}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    let ports = if ports.is_empty() { "<none>".to_string() } else { ports.join(",") };
    vec![
        name,
        type_.into(),
        or_none(cluster_ip).into(),
        external.into(),
        ports.into(),
        age,
        format_labels(svc.pointer("/spec/selector")).into(),
    ]
}

/// A string field, `default` when missing or empty (the defaulted value).
fn obj_str_or<'a>(obj: &'a Value, ptr: &str, default: &'a str) -> &'a str {
    match str_at(obj, ptr) {
        "" => default,
        s => s,
    }
}

fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The `Endpoints` cell: up to three `ip:port`, then `+ N more...`.
fn format_endpoints(ep: &Value) -> String {
    let subsets = arr_at(ep, "/subsets");
    if subsets.is_empty() {
        return "<none>".into();
    }
    const MAX: usize = 3;
    let mut list: Vec<String> = Vec::new();
    let mut more = false;
    let mut count = 0usize;
    for ss in subsets {
        let addresses = arr_at(ss, "/addresses");
        let ports = arr_at(ss, "/ports");
        if ports.is_empty() {
            // A headless service may have no ports.
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(str_at(a, "/ip").to_string());
            }
            continue;
        }
        for port in ports {
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(join_host_port(str_at(a, "/ip"), int_at(port, "/port")));
            }
        }
    }
    let joined = list.join(",");
    if more {
        format!("{joined} + {} more...", count - MAX)
    } else {
        joined
    }
}

// ---- events ---------------------------------------------------------------

fn event_cells(ev: &Value, name: Value, now: DateTime<Utc>) -> Vec<Value> {
    let first_time = time_at(ev, "/firstTimestamp");
    let first = match first_time {
        Some(_) => since(first_time, now),
        None => since(time_at(ev, "/eventTime"), now),
    };
    let mut last = match time_at(ev, "/lastTimestamp") {
        Some(t) => since(Some(t), now),
        None => first.clone(),
    };
    let mut count = int_at(ev, "/count");
    if ev.pointer("/series").is_some_and(Value::is_object) {
        last = since(time_at(ev, "/series/lastObservedTime"), now);
        count = int_at(ev, "/series/count");
    } else if count == 0 {
        // Singleton events have no count in the new API.
        count = 1;
    }
    let kind = str_at(ev, "/involvedObject/kind").to_lowercase();
    let target = match str_at(ev, "/involvedObject/name") {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let component = obj_str_or(ev, "/source/component", str_at(ev, "/reportingComponent"));
    let instance = obj_str_or(ev, "/source/host", str_at(ev, "/reportingInstance"));
    let source = if instance.is_empty() { component.to_string() } else { format!("{component}, {instance}") };
    vec![
        last.into(),
        str_at(ev, "/type").into(),
        str_at(ev, "/reason").into(),
        target.into(),
        str_at(ev, "/involvedObject/fieldPath").into(),
        source.into(),
        str_at(ev, "/message").trim().into(),
        first.into(),
        count.into(),
        name,
    ]
}

// ---- jobs -----------------------------------------------------------------

/// Whether the first condition of `type_` is true, as `hasJobCondition`.
fn job_condition(job: &Value, type_: &str) -> bool {
    arr_at(job, "/status/conditions")
        .iter()
        .find(|c| str_at(c, "/type") == type_)
        .is_some_and(|c| str_at(c, "/status") == "True")
}

fn job_cells(job: &Value, name: Value, age: Value, now: DateTime<Utc>) -> Vec<Value> {
    let succeeded = int_at(job, "/status/succeeded");
    let completions = match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int_at(job, "/spec/parallelism") {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (time_at(job, "/status/startTime"), time_at(job, "/status/completionTime")) {
        (None, _) => String::new(),
        (Some(start), None) => meta::human_duration((now - start).num_seconds()),
        (Some(start), Some(end)) => meta::human_duration((end - start).num_seconds()),
    };
    let status = if job_condition(job, "Complete") {
        "Complete"
    } else if job_condition(job, "Failed") {
        "Failed"
    } else if meta::deletion_timestamp(job).is_some() {
        "Terminating"
    } else if job_condition(job, "Suspended") {
        "Suspended"
    } else if job_condition(job, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let (names, images) = container_cells(job, "/spec/template/spec/containers");
    vec![
        name,
        status.into(),
        completions.into(),
        duration.into(),
        age,
        names.into(),
        images.into(),
        format_label_selector(job.pointer("/spec/selector")).into(),
    ]
}

// ---- resource quotas ------------------------------------------------------

/// `resource: used/hard` per hard limit, sorted by resource; those named
/// `limits.*` in the second column.
fn quota_columns(quota: &Value) -> (String, String) {
    let hard: BTreeMap<&str, String> = quota
        .pointer("/status/hard")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), quantity(v))).collect())
        .unwrap_or_default();
    let mut request = Vec::new();
    let mut limit = Vec::new();
    for (resource, hard) in hard {
        let used = quota.pointer("/status/used").and_then(|u| u.get(resource)).map_or_else(|| "0".into(), quantity);
        let text = format!("{resource}: {used}/{hard}");
        let pieces: Vec<&str> = resource.split('.').collect();
        if pieces.len() > 1 && pieces[0] == "limits" {
            limit.push(text);
        } else {
            request.push(text);
        }
    }
    (request.join(", "), limit.join(", "))
}

fn quantity(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "0".into(),
        other => other.to_string(),
    }
}

// ---- rendering ------------------------------------------------------------

#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions {
    /// `-o wide`: also the priority-1 columns.
    pub wide: bool,
    /// A leading NAMESPACE column (`-A`).
    pub namespace_column: bool,
    pub no_headers: bool,
    pub show_labels: bool,
}

/// kubectl's tabwriter settings (`cli-runtime/pkg/printers/tabwriter.go`).
const MIN_WIDTH: usize = 6;
const PADDING: usize = 3;

/// The text kubectl prints for a Table; `""` when it has no rows (the
/// caller then says "No resources found").
pub fn render(table: &Value, options: RenderOptions) -> String {
    let rows = arr_at(table, "/rows");
    if rows.is_empty() {
        return String::new();
    }
    let defs = arr_at(table, "/columnDefinitions");
    let visible: Vec<usize> = (0..defs.len()).filter(|&i| options.wide || int_at(&defs[i], "/priority") == 0).collect();

    let mut lines: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    if !options.no_headers {
        let mut header = Vec::new();
        if options.namespace_column {
            header.push("NAMESPACE".to_string());
        }
        header.extend(visible.iter().map(|&i| str_at(&defs[i], "/name").to_uppercase()));
        if options.show_labels {
            header.push("LABELS".to_string());
        }
        lines.push(header);
    }
    for row in rows {
        let object = row.get("object").filter(|o| o.is_object());
        let mut line = Vec::new();
        if options.namespace_column {
            line.push(object.and_then(meta::namespace).unwrap_or("").to_string());
        }
        let cells = arr_at(row, "/cells");
        // More cells than columns is bad server output; kubectl ignores them.
        line.extend(visible.iter().filter_map(|&i| cells.get(i)).map(cell_text));
        if options.show_labels {
            if let Some(object) = object {
                line.push(format_labels(object.pointer("/metadata/labels")));
            }
        }
        lines.push(line);
    }
    tabwrite(&lines)
}

/// A cell as kubectl's `fmt.Fprint` shows it; tabs and newlines become
/// spaces so that one cell cannot break the layout.
fn cell_text(cell: &Value) -> String {
    let text = match cell {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    };
    text.replace(['\t', '\n', '\r'], " ")
}

/// Go's `text/tabwriter` with kubectl's settings, left-aligned: each line
/// is its cells, all but the last tab-terminated. A column's width is set
/// per block of consecutive lines that have a terminated cell in it.
fn tabwrite(lines: &[Vec<String>]) -> String {
    let mut out = String::new();
    let mut widths = Vec::new();
    format_block(lines, &mut widths, &mut out);
    out
}

fn format_block(lines: &[Vec<String>], widths: &mut Vec<usize>, out: &mut String) {
    let column = widths.len();
    let mut start = 0;
    let mut this = 0;
    while this < lines.len() {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        write_lines(&lines[start..this], widths, out);
        start = this;
        let mut width = MIN_WIDTH;
        while this < lines.len() && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count() + PADDING);
            this += 1;
        }
        widths.push(width);
        format_block(&lines[start..this], widths, out);
        widths.pop();
        start = this;
    }
    write_lines(&lines[start..], widths, out);
}

fn write_lines(lines: &[Vec<String>], widths: &[usize], out: &mut String) {
    for line in lines {
        for (j, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if let Some(&w) = widths.get(j) {
                if j + 1 < line.len() {
                    out.extend(std::iter::repeat_n(' ', w.saturating_sub(cell.chars().count())));
                }
            }
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{catalog, of};

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
        let failed =
            json!({"name": "a", "restartCount": 2, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}});
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
        let ns =
            json!({"metadata": {"name": "prod", "creationTimestamp": ago(45)}, "status": {"phase": "Terminating"}});
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
        let failed =
            json!({"spec": {"completions": 2}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}});
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
        assert_eq!(
            &cells_of(Kind::CronJob, &tz)[2..6],
            &[json!("Europe/Oslo"), json!("True"), json!(0), json!("<none>")]
        );
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
        let wide_names =
            |k: Kind| columns(of(k)).iter().filter(|c| c.priority == 1).map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(wide_names(Kind::Pod), ["IP", "Node", "Nominated Node", "Readiness Gates"]);
        assert_eq!(
            wide_names(Kind::Node),
            ["Internal-IP", "External-IP", "OS-Image", "Kernel-Version", "Container-Runtime"]
        );
        assert_eq!(wide_names(Kind::Event), ["Subobject", "Source", "First Seen", "Count", "Name"]);
        assert_eq!(wide_names(Kind::Deployment), ["Containers", "Images", "Selector"]);
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
}
