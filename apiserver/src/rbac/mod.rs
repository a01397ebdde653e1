//! Role-based access control, as Kubernetes' RBAC authorizer decides:
//! a request is allowed when some binding names the user (or one of its
//! groups, or its service account) and the role it refers to has a rule
//! covering the request. A RoleBinding grants its role's rules in its own
//! namespace only; a ClusterRoleBinding grants them everywhere, for
//! cluster-scoped resources and non-resource URLs too.
//!
//! [`Policy`] is the evaluator: a plain value built from the stored
//! objects, with no I/O, so it is tested table by table. Aggregated
//! ClusterRoles (`aggregationRule`) are resolved when the policy is built:
//! their rules are the union of the rules of every ClusterRole their
//! selectors match, transitively. [`cache`] keeps a member's policy in step
//! with the store; [`bootstrap`] holds the roles every cluster has.

pub mod bootstrap;
pub mod cache;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{json, Value};
use skiff_api::selector::LabelSelector;

use crate::admission::UserInfo;

/// What a request asks to do, for the authorizer: a verb on a resource,
/// or on a path outside the resource API (`/metrics`, `/api`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        subresource: &'a str,
        /// Empty for cluster-scoped resources and requests across namespaces.
        namespace: &'a str,
        /// Empty for collections.
        name: &'a str,
    },
    Path {
        verb: &'a str,
        path: &'a str,
    },
}

impl Action<'_> {
    /// Why RBAC refuses this action to `user`, worded as kube-apiserver's
    /// message reads after `... is forbidden: `.
    pub fn denial(&self, user: &UserInfo) -> String {
        match *self {
            Action::Resource { verb, group, resource, subresource, namespace, .. } => {
                let resource =
                    if subresource.is_empty() { resource.to_string() } else { format!("{resource}/{subresource}") };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace \"{namespace}\"")
                };
                format!("User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}", user.name)
            }
            Action::Path { verb, path } => format!("User \"{}\" cannot {verb} path \"{path}\"", user.name),
        }
    }
}

/// One rule of a role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

impl Rule {
    pub(crate) fn from_json(rule: &Value) -> Rule {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default()
        };
        Rule {
            verbs: strings("verbs"),
            api_groups: strings("apiGroups"),
            resources: strings("resources"),
            resource_names: strings("resourceNames"),
            non_resource_urls: strings("nonResourceURLs"),
        }
    }

    pub fn to_json(&self) -> Value {
        let mut rule = json!({"verbs": self.verbs});
        for (key, values) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !values.is_empty() {
                rule[key] = json!(values);
            }
        }
        rule
    }

    /// Whether this rule allows `action` (Kubernetes' `RuleAllows`).
    pub fn allows(&self, action: &Action<'_>) -> bool {
        match *action {
            Action::Resource { verb, group, resource, subresource, name, .. } => {
                has(&self.verbs, verb)
                    && has(&self.api_groups, group)
                    && self.matches_resource(resource, subresource)
                    && (self.resource_names.is_empty()
                        || (!name.is_empty() && self.resource_names.iter().any(|n| n == name)))
            }
            Action::Path { verb, path } => {
                has(&self.verbs, verb)
                    && self.non_resource_urls.iter().any(|url| match url.strip_suffix('*') {
                        Some(prefix) => path.starts_with(prefix),
                        None => url == path,
                    })
            }
        }
    }

    /// `*`, the resource itself, `resource/subresource`, or `*/subresource`.
    fn matches_resource(&self, resource: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            if r == "*" {
                return true;
            }
            if subresource.is_empty() {
                return r == resource;
            }
            match r.split_once('/') {
                Some((res, sub)) => sub == subresource && (res == resource || res == "*"),
                None => false,
            }
        })
    }
}

/// The value itself or `*`.
fn has(values: &[String], wanted: &str) -> bool {
    values.iter().any(|v| v == "*" || v == wanted)
}

/// Who a binding names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
    ServiceAccount { namespace: String, name: String },
}

impl Subject {
    fn applies_to(&self, user: &UserInfo) -> bool {
        match self {
            Subject::User(name) => *name == user.name,
            Subject::Group(name) => user.groups.iter().any(|g| g == name),
            Subject::ServiceAccount { namespace, name } => {
                user.name.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':'))
                    == Some((namespace.as_str(), name.as_str()))
            }
        }
    }
}

/// A RoleBinding or ClusterRoleBinding.
#[derive(Clone, Debug)]
struct Binding {
    /// Empty for a ClusterRoleBinding.
    namespace: String,
    /// `Role` or `ClusterRole`.
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_json(obj: &Value) -> Binding {
        let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let subjects = obj["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let name = s["name"].as_str()?.to_string();
                Some(match s["kind"].as_str()? {
                    "User" => Subject::User(name),
                    "Group" => Subject::Group(name),
                    "ServiceAccount" => Subject::ServiceAccount {
                        // A RoleBinding's service account without a
                        // namespace is the binding's own.
                        namespace: s["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(&namespace).to_string(),
                        name,
                    },
                    _ => return None,
                })
            })
            .collect();
        Binding {
            role_kind: obj["roleRef"]["kind"].as_str().unwrap_or_default().to_string(),
            role_name: obj["roleRef"]["name"].as_str().unwrap_or_default().to_string(),
            namespace,
            subjects,
        }
    }
}

/// Every role and binding of the cluster, ready to answer.
#[derive(Debug, Default)]
pub struct Policy {
    /// Aggregation already resolved.
    cluster_roles: HashMap<String, Vec<Rule>>,
    /// By namespace, then name.
    roles: HashMap<String, HashMap<String, Vec<Rule>>>,
    cluster_bindings: Vec<Binding>,
    /// By namespace.
    bindings: HashMap<String, Vec<Binding>>,
}

impl Policy {
    /// The policy the stored objects make.
    pub fn new(roles: &[Value], cluster_roles: &[Value], bindings: &[Value], cluster_bindings: &[Value]) -> Policy {
        let mut policy = Policy { cluster_roles: aggregate(cluster_roles), ..Default::default() };
        for role in roles {
            let namespace = role["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            let name = role["metadata"]["name"].as_str().unwrap_or_default().to_string();
            policy.roles.entry(namespace).or_default().insert(name, rules_of(role));
        }
        for binding in bindings {
            let binding = Binding::from_json(binding);
            policy.bindings.entry(binding.namespace.clone()).or_default().push(binding);
        }
        policy.cluster_bindings = cluster_bindings.iter().map(Binding::from_json).collect();
        policy
    }

    /// The rules of the role `binding` refers to (none if it is missing).
    fn rules_of(&self, binding: &Binding) -> &[Rule] {
        let rules = match binding.role_kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&binding.role_name),
            "Role" => self.roles.get(&binding.namespace).and_then(|r| r.get(&binding.role_name)),
            _ => None,
        };
        rules.map(Vec::as_slice).unwrap_or_default()
    }

    /// The bindings that apply to `user` for a request in `namespace`
    /// (cluster bindings always; role bindings of that namespace).
    fn applicable<'a>(&'a self, user: &'a UserInfo, namespace: &str) -> impl Iterator<Item = &'a Binding> + 'a {
        let local = if namespace.is_empty() { None } else { self.bindings.get(namespace) };
        self.cluster_bindings
            .iter()
            .chain(local.into_iter().flatten())
            .filter(move |b| b.subjects.iter().any(|s| s.applies_to(user)))
    }

    /// Whether `user` may do `action`.
    pub fn allows(&self, user: &UserInfo, action: &Action<'_>) -> bool {
        let namespace = match action {
            Action::Resource { namespace, .. } => *namespace,
            // Only cluster bindings grant non-resource URLs.
            Action::Path { .. } => "",
        };
        self.applicable(user, namespace).any(|b| self.rules_of(b).iter().any(|r| r.allows(action)))
    }

    /// Every rule `user` has in `namespace` (cluster-wide ones included):
    /// what `SelfSubjectRulesReview` lists and escalation checks compare
    /// against.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        let mut rules: Vec<Rule> = Vec::new();
        for b in self.applicable(user, namespace) {
            for r in self.rules_of(b) {
                if !rules.contains(r) {
                    rules.push(r.clone());
                }
            }
        }
        rules
    }

    /// The rules of a role a binding may refer to, for escalation checks:
    /// `None` if it does not exist.
    pub fn role_rules(&self, kind: &str, namespace: &str, name: &str) -> Option<&[Rule]> {
        match kind {
            "ClusterRole" => self.cluster_roles.get(name).map(Vec::as_slice),
            "Role" => self.roles.get(namespace).and_then(|r| r.get(name)).map(Vec::as_slice),
            _ => None,
        }
    }
}

fn rules_of(role: &Value) -> Vec<Rule> {
    role["rules"].as_array().into_iter().flatten().map(Rule::from_json).collect()
}

/// Each ClusterRole's rules, those of aggregated roles being the union of
/// the rules of the roles they select, followed transitively (a cycle
/// adds nothing twice and ends).
fn aggregate(cluster_roles: &[Value]) -> HashMap<String, Vec<Rule>> {
    struct Role {
        labels: BTreeMap<String, String>,
        own: Vec<Rule>,
        selectors: Option<Vec<LabelSelector>>,
    }
    let roles: BTreeMap<String, Role> = cluster_roles
        .iter()
        .map(|obj| {
            let labels = obj["metadata"]["labels"]
                .as_object()
                .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
                .unwrap_or_default();
            let selectors = obj["aggregationRule"]["clusterRoleSelectors"].as_array().map(|s| {
                // A selector that does not parse selects nothing.
                s.iter().filter_map(|s| LabelSelector::from_api(s).ok()).collect()
            });
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            (name, Role { labels, own: rules_of(obj), selectors })
        })
        .collect();
    let mut out = HashMap::new();
    for (name, role) in &roles {
        if role.selectors.is_none() {
            out.insert(name.clone(), role.own.clone());
            continue;
        }
        let mut rules = role.own.clone();
        let mut seen: HashSet<&str> = HashSet::from([name.as_str()]);
        let mut pending = vec![role];
        while let Some(aggregating) = pending.pop() {
            let selectors = aggregating.selectors.as_deref().unwrap_or_default();
            for (other_name, other) in &roles {
                if seen.contains(other_name.as_str()) || !selectors.iter().any(|s| s.matches(&other.labels)) {
                    continue;
                }
                seen.insert(other_name);
                for r in &other.own {
                    if !rules.contains(r) {
                        rules.push(r.clone());
                    }
                }
                if other.selectors.is_some() {
                    pending.push(other);
                }
            }
        }
        out.insert(name.clone(), rules);
    }
    out
}

/// Whether `owned` covers every permission `wanted` grants (Kubernetes'
/// `Covers`), for the escalation check: a user may only create a role, or
/// bind one, whose rules they hold themselves. A `*` in `wanted` is
/// covered only by a `*`; resource names narrow a rule, so a rule without
/// them covers one with them.
pub fn covers(owned: &[Rule], wanted: &Rule) -> bool {
    if !wanted.non_resource_urls.is_empty() {
        return wanted.verbs.iter().all(|verb| {
            wanted.non_resource_urls.iter().all(|url| {
                owned.iter().any(|o| {
                    has(&o.verbs, verb)
                        && o.non_resource_urls.iter().any(|own| {
                            own == url || own.strip_suffix('*').is_some_and(|prefix| url.starts_with(prefix))
                        })
                })
            })
        });
    }
    let names: Vec<Option<&str>> = if wanted.resource_names.is_empty() {
        vec![None]
    } else {
        wanted.resource_names.iter().map(|n| Some(n.as_str())).collect()
    };
    for verb in &wanted.verbs {
        for group in &wanted.api_groups {
            for resource in &wanted.resources {
                for name in &names {
                    let covered = owned.iter().any(|o| {
                        has(&o.verbs, verb)
                            && has(&o.api_groups, group)
                            && (o.resources.iter().any(|r| r == "*" || r == resource)
                                || resource
                                    .split_once('/')
                                    .is_some_and(|(_, sub)| o.resources.iter().any(|r| *r == format!("*/{sub}"))))
                            && (o.resource_names.is_empty()
                                || name.is_some_and(|n| o.resource_names.iter().any(|x| x == n)))
                    });
                    if !covered {
                        return false;
                    }
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests;
