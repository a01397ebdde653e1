//! The columns `get` shows per kind and the cells of each object's row:
//! the column definitions and cell values of the Kubernetes 1.32
//! apiserver's `pkg/printers/internalversion/printers.go`. Kinds without a
//! printer there (LimitRange) get the apiserver's default columns, `Name`
//! and `Created At`.
//!
//! Objects are read as JSON and may lack any field; a missing field reads as
//! the value Kubernetes' defaulting would have given it (one replica, type
//! `ClusterIP`, protocol `TCP`, ...), so a stored object and its defaulted
//! form print the same.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::Column;
use crate::meta;
use crate::resources::{Kind, ResourceInfo};

const fn col(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 0 }
}

const fn wide(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column { name, type_, format: "", description, priority: 1 }
}

// Descriptions: the Swagger docs the Kubernetes printers reference.
pub(super) const D_NAME: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
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

static ENDPOINT_SLICE: [Column; 5] = [
    NAME,
    col("AddressType", "string", "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name."),
    col("Ports", "string", "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. When ports is empty, it indicates that there are no defined ports. When a port is defined with a nil port value, it indicates \"all ports\". Each slice may include a maximum of 100 ports."),
    col("Endpoints", "string", "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints."),
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

static REPLICATION_CONTROLLER: [Column; 8] = [
    NAME,
    col("Desired", "integer", "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller"),
    col("Current", "integer", "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller"),
    col("Ready", "integer", "The number of ready replicas for this replication controller."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide("Selector", "string", "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
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

static PRIORITY_CLASS: [Column; 5] = [
    NAME,
    col("Value", "integer", "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec."),
    col("Global-Default", "boolean", "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority."),
    AGE,
    col("PreemptionPolicy", "string", "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset."),
];

static POD_DISRUPTION_BUDGET: [Column; 5] = [
    NAME,
    col("Min Available", "string", "The minimum number or percentage of available pods this budget requires."),
    col("Max Unavailable", "string", "The maximum number or percentage of unavailable pods this budget requires."),
    col("Allowed Disruptions", "integer", "The number of disruptions that are currently allowed."),
    AGE,
];

static ROLE_BINDING: [Column; 6] = [
    NAME,
    col("Role", "string", "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable."),
    AGE,
    wide("Users", "string", "Users in the binding"),
    wide("Groups", "string", "Groups in the binding"),
    wide("ServiceAccounts", "string", "ServiceAccounts in the binding"),
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
        Kind::EndpointSlice => &ENDPOINT_SLICE,
        Kind::ConfigMap => &CONFIG_MAP,
        Kind::Secret => &SECRET,
        Kind::ServiceAccount => &SERVICE_ACCOUNT,
        Kind::Event => &EVENT,
        Kind::Lease => &LEASE,
        Kind::ReplicaSet => &REPLICA_SET,
        Kind::ReplicationController => &REPLICATION_CONTROLLER,
        Kind::Deployment => &DEPLOYMENT,
        Kind::DaemonSet => &DAEMON_SET,
        Kind::Job => &JOB,
        Kind::CronJob => &CRON_JOB,
        Kind::ResourceQuota => &RESOURCE_QUOTA,
        Kind::LimitRange => &DEFAULT,
        Kind::PriorityClass => &PRIORITY_CLASS,
        Kind::PodDisruptionBudget => &POD_DISRUPTION_BUDGET,
        Kind::CustomResourceDefinition | Kind::Role | Kind::ClusterRole => &DEFAULT,
        Kind::RoleBinding | Kind::ClusterRoleBinding => &ROLE_BINDING,
        Kind::Custom => info.custom.map_or(&DEFAULT[..], |c| &c.columns[..]),
    }
}

/// The row conditions of `obj`'s row, for kinds that have them (a
/// finished pod's `Completed`).
pub fn row_conditions(info: &ResourceInfo, obj: &Value) -> Option<Value> {
    match info.kind_id {
        Kind::Pod => pod_row_conditions(obj),
        _ => None,
    }
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
        Kind::EndpointSlice => {
            let ports = arr_at(obj, "/ports").iter().map(|p| match p.pointer("/port").and_then(Value::as_i64) {
                Some(n) => n.to_string(),
                None => p.pointer("/name").and_then(Value::as_str).unwrap_or("<unset>").to_string(),
            });
            let addresses = arr_at(obj, "/endpoints")
                .iter()
                .flat_map(|e| arr_at(e, "/addresses").iter().map(|a| a.as_str().unwrap_or_default().to_string()));
            vec![
                name,
                str_at(obj, "/addressType").into(),
                list_with_more(ports.collect()).into(),
                list_with_more(addresses.collect()).into(),
                age,
            ]
        }
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
        Kind::ReplicationController => {
            let (names, images) = container_cells(obj, "/spec/template/spec/containers");
            vec![
                name,
                int_or(obj, "/spec/replicas", 1).into(),
                int_at(obj, "/status/replicas").into(),
                int_at(obj, "/status/readyReplicas").into(),
                age,
                names.into(),
                images.into(),
                format_labels(obj.pointer("/spec/selector")).into(),
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
        Kind::PriorityClass => vec![
            name,
            obj.pointer("/value").and_then(Value::as_i64).unwrap_or(0).into(),
            obj.pointer("/globalDefault").and_then(Value::as_bool).unwrap_or(false).into(),
            age,
            obj.pointer("/preemptionPolicy").and_then(Value::as_str).unwrap_or("<unset>").into(),
        ],
        Kind::PodDisruptionBudget => {
            // An int-or-string, printed as given; N/A when unset.
            let bound = |pointer: &str| match obj.pointer(pointer) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "N/A".to_string(),
            };
            vec![
                name,
                bound("/spec/minAvailable").into(),
                bound("/spec/maxUnavailable").into(),
                obj.pointer("/status/disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0).into(),
                age,
            ]
        }
        Kind::CustomResourceDefinition | Kind::Role | Kind::ClusterRole => vec![name, created_at(obj).into()],
        Kind::RoleBinding | Kind::ClusterRoleBinding => role_binding_cells(obj, name, age),
        Kind::Custom => crate::custom::cells(info, obj, now),
    }
}

/// `Role/<name>`, then who the binding names, by kind, as Kubernetes'
/// `printRoleBinding` lists them.
fn role_binding_cells(obj: &Value, name: Value, age: Value) -> Vec<Value> {
    let role = format!("{}/{}", str_at(obj, "/roleRef/kind"), str_at(obj, "/roleRef/name"));
    let subjects = arr_at(obj, "/subjects");
    let of_kind = |kind: &str| {
        let names = subjects.iter().filter(|s| str_at(s, "/kind") == kind).map(|s| match kind {
            "ServiceAccount" => format!("{}/{}", str_at(s, "/namespace"), str_at(s, "/name")),
            _ => str_at(s, "/name").to_string(),
        });
        names.collect::<Vec<_>>().join(", ")
    };
    vec![name, role.into(), age, of_kind("User").into(), of_kind("Group").into(), of_kind("ServiceAccount").into()]
}

// ---- reading fields -------------------------------------------------------

pub(super) fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn int_at(obj: &Value, ptr: &str) -> i64 {
    int_or(obj, ptr, 0)
}

fn int_or(obj: &Value, ptr: &str, default: i64) -> i64 {
    obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(default)
}

fn bool_at(obj: &Value, ptr: &str) -> bool {
    obj.pointer(ptr).and_then(Value::as_bool).unwrap_or(false)
}

pub(super) fn arr_at<'a>(obj: &'a Value, ptr: &str) -> &'a [Value] {
    obj.pointer(ptr).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

fn obj_len(obj: &Value, ptr: &str) -> usize {
    obj.pointer(ptr).and_then(Value::as_object).map_or(0, Map::len)
}

pub(super) fn parse_time(s: &str) -> Option<DateTime<Utc>> {
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
pub(super) fn format_labels(map: Option<&Value>) -> String {
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

/// kubectl's `listWithMoreString`: up to three items, then `+ N more...`;
/// `<unset>` for none.
fn list_with_more(items: Vec<String>) -> String {
    const MAX: usize = 3;
    let shown = items[..items.len().min(MAX)].join(",");
    if items.len() > MAX {
        format!("{shown} + {} more...", items.len() - MAX)
    } else if shown.is_empty() {
        "<unset>".into()
    } else {
        shown
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
