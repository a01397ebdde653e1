//! The catalog of resources Skiff serves: what each is called on the wire
//! (group, version, kind, plural, short names), whether it is namespaced and
//! which subresources it has. The registry, the REST discovery documents and
//! `skiffctl` all read this one table. Custom resources come from their
//! definitions at run time ([`crate::custom`]).

use crate::custom::CustomResource;

/// The built-in kinds, for code that behaves differently per kind
/// (validation, defaulting, field selectors, table columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Pod,
    Node,
    Service,
    Endpoints,
    EndpointSlice,
    ConfigMap,
    Secret,
    ServiceAccount,
    Event,
    Lease,
    ReplicationController,
    ReplicaSet,
    Deployment,
    DaemonSet,
    Job,
    CronJob,
    ResourceQuota,
    LimitRange,
    PriorityClass,
    PodDisruptionBudget,
    CustomResourceDefinition,
    Role,
    ClusterRole,
    RoleBinding,
    ClusterRoleBinding,
    /// A kind a CustomResourceDefinition adds: never in the catalog; its
    /// [`ResourceInfo`] carries a [`CustomResource`].
    Custom,
}

/// One served resource.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    pub kind_id: Kind,
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The plural name used in URLs and storage keys (`pods`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub namespaced: bool,
    pub subresources: &'static [&'static str],
    /// `all` for the kinds `kubectl get all` lists.
    pub categories: &'static [&'static str],
    /// The schema and columns of a custom resource ([`Kind::Custom`]).
    pub custom: Option<&'static CustomResource>,
}

impl ResourceInfo {
    /// `v1` for the core group, `apps/v1` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `pods` for the core group, `deployments.apps` otherwise: how Kubernetes
    /// names the resource in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn has_subresource(&self, name: &str) -> bool {
        self.subresources.contains(&name)
    }

    /// The storage prefix of every object of this resource, ending in `/`:
    /// `/registry/<plural>/` for built-in resources, and, as Kubernetes
    /// stores them, `/registry/<group>/<plural>/` for custom ones (every
    /// served version of a CRD shares it).
    pub fn prefix(&self) -> String {
        if self.kind_id == Kind::Custom {
            format!("/registry/{}/{}/", self.group, self.plural)
        } else {
            format!("/registry/{}/", self.plural)
        }
    }

    /// The storage prefix of this resource in one namespace (or, for
    /// cluster-scoped resources or `None`, of all of it).
    pub fn namespace_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/", self.prefix()),
            _ => self.prefix(),
        }
    }

    /// Where one object is stored: `<prefix>/<namespace>/<name>`, without
    /// the namespace for cluster-scoped resources.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/{name}", self.prefix()),
            _ => format!("{}{name}", self.prefix()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
const fn info(
    kind_id: Kind,
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    subresources: &'static [&'static str],
    categories: &'static [&'static str],
) -> ResourceInfo {
    ResourceInfo {
        kind_id,
        group,
        version: "v1",
        kind,
        plural,
        singular,
        short_names,
        namespaced,
        subresources,
        categories,
        custom: None,
    }
}

const ALL: &[&str] = &["all"];
/// The group of Role, ClusterRole and their bindings.
pub const RBAC: &str = "rbac.authorization.k8s.io";

static CATALOG: [ResourceInfo; 26] = [
    info(Kind::Namespace, "", "Namespace", "namespaces", "namespace", &["ns"], false, &["status", "finalize"], &[]),
    info(
        Kind::Pod,
        "",
        "Pod",
        "pods",
        "pod",
        &["po"],
        true,
        &["status", "binding", "eviction", "log", "exec", "attach", "portforward", "ephemeralcontainers"],
        ALL,
    ),
    info(Kind::Node, "", "Node", "nodes", "node", &["no"], false, &["status"], &[]),
    info(Kind::Service, "", "Service", "services", "service", &["svc"], true, &["status"], ALL),
    info(Kind::Endpoints, "", "Endpoints", "endpoints", "endpoints", &["ep"], true, &[], &[]),
    info(
        Kind::EndpointSlice,
        "discovery.k8s.io",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        &[],
        true,
        &[],
        &[],
    ),
    info(Kind::ConfigMap, "", "ConfigMap", "configmaps", "configmap", &["cm"], true, &[], &[]),
    info(Kind::Secret, "", "Secret", "secrets", "secret", &[], true, &[], &[]),
    info(
        Kind::ServiceAccount,
        "",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        &["sa"],
        true,
        &["token"],
        &[],
    ),
    info(Kind::Event, "", "Event", "events", "event", &["ev"], true, &[], &[]),
    info(Kind::Lease, "coordination.k8s.io", "Lease", "leases", "lease", &[], true, &[], &[]),
    info(
        Kind::ReplicationController,
        "",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        &["rc"],
        true,
        &["status", "scale"],
        ALL,
    ),
    info(Kind::ReplicaSet, "apps", "ReplicaSet", "replicasets", "replicaset", &["rs"], true, &["status", "scale"], ALL),
    info(
        Kind::Deployment,
        "apps",
        "Deployment",
        "deployments",
        "deployment",
        &["deploy"],
        true,
        &["status", "scale"],
        ALL,
    ),
    info(Kind::DaemonSet, "apps", "DaemonSet", "daemonsets", "daemonset", &["ds"], true, &["status"], ALL),
    info(Kind::Job, "batch", "Job", "jobs", "job", &[], true, &["status"], ALL),
    info(Kind::CronJob, "batch", "CronJob", "cronjobs", "cronjob", &["cj"], true, &["status"], ALL),
    info(
        Kind::ResourceQuota,
        "",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        &["quota"],
        true,
        &["status"],
        &[],
    ),
    info(Kind::LimitRange, "", "LimitRange", "limitranges", "limitrange", &["limits"], true, &[], &[]),
    info(
        Kind::PriorityClass,
        "scheduling.k8s.io",
        "PriorityClass",
        "priorityclasses",
        "priorityclass",
        &["pc"],
        false,
        &[],
        &[],
    ),
    info(
        Kind::PodDisruptionBudget,
        "policy",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        &["pdb"],
        true,
        &["status"],
        &[],
    ),
    info(
        Kind::CustomResourceDefinition,
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        &["crd", "crds"],
        false,
        &["status"],
        &["api-extensions"],
    ),
    info(Kind::Role, RBAC, "Role", "roles", "role", &[], true, &[], &[]),
    info(Kind::ClusterRole, RBAC, "ClusterRole", "clusterroles", "clusterrole", &[], false, &[], &[]),
    info(Kind::RoleBinding, RBAC, "RoleBinding", "rolebindings", "rolebinding", &[], true, &[], &[]),
    info(
        Kind::ClusterRoleBinding,
        RBAC,
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        &[],
        false,
        &[],
        &[],
    ),
];

/// Every served resource.
pub fn catalog() -> &'static [ResourceInfo] {
    &CATALOG
}

/// The resource stored under `plural` (`pods`), optionally in `group`.
pub fn by_plural(group: Option<&str>, plural: &str) -> Option<&'static ResourceInfo> {
    CATALOG.iter().find(|r| r.plural == plural && group.is_none_or(|g| g == r.group))
}

/// The resource of an object's `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    CATALOG.iter().find(|r| r.kind == kind && r.api_version() == api_version)
}

/// The resource of a built-in kind. Custom resources are not here: the
/// apiserver builds theirs from their definitions.
pub fn of(kind: Kind) -> &'static ResourceInfo {
    CATALOG.iter().find(|r| r.kind_id == kind).expect("every kind is in the catalog")
}

/// What a user typed on a command line: a plural, singular, short name or
/// kind, case-insensitive, optionally qualified with its group
/// (`deployments.apps`, `deploy`, `Pod`).
pub fn lookup(name: &str) -> Option<&'static ResourceInfo> {
    let name = name.to_ascii_lowercase();
    let (name, group) = match name.split_once('.') {
        Some((n, g)) => (n.to_string(), Some(g.to_string())),
        None => (name, None),
    };
    CATALOG.iter().find(|r| {
        group.as_deref().is_none_or(|g| g == r.group)
            && (r.plural == name
                || r.singular == name
                || r.short_names.contains(&name.as_str())
                || r.kind.eq_ignore_ascii_case(&name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_accepts_plural_singular_short_and_qualified_names() {
        assert_eq!(lookup("pods").unwrap().kind, "Pod");
        assert_eq!(lookup("po").unwrap().kind, "Pod");
        assert_eq!(lookup("Deployment").unwrap().plural, "deployments");
        assert_eq!(lookup("deploy").unwrap().group, "apps");
        assert_eq!(lookup("deployments.apps").unwrap().kind, "Deployment");
        assert_eq!(lookup("leases").unwrap().api_version(), "coordination.k8s.io/v1");
        assert_eq!(lookup("endpointslices").unwrap().api_version(), "discovery.k8s.io/v1");
        assert_eq!(lookup("endpointslices.discovery.k8s.io").unwrap().kind, "EndpointSlice");
        assert_eq!(lookup("pc").unwrap().api_version(), "scheduling.k8s.io/v1");
        assert!(!lookup("priorityclasses").unwrap().namespaced);
        assert_eq!(lookup("pdb").unwrap().api_version(), "policy/v1");
        assert!(lookup("deployments.batch").is_none());
        assert!(lookup("widgets").is_none());
    }

    #[test]
    fn keys_follow_the_registry_layout() {
        let pods = of(Kind::Pod);
        assert_eq!(pods.key(Some("default"), "web-1"), "/registry/pods/default/web-1");
        let nodes = of(Kind::Node);
        assert_eq!(nodes.key(Some("ignored"), "n1"), "/registry/nodes/n1");
        assert_eq!(pods.namespace_prefix(None), "/registry/pods/");
        assert_eq!(pods.namespace_prefix(Some("a")), "/registry/pods/a/");
    }

    #[test]
    fn every_kind_has_exactly_one_entry() {
        for r in catalog() {
            assert_eq!(catalog().iter().filter(|o| o.kind_id == r.kind_id).count(), 1, "{}", r.kind);
            assert_eq!(by_kind(&r.api_version(), r.kind), Some(r));
        }
    }
}
