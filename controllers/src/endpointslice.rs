//! The EndpointSlice controller: the `discovery.k8s.io/v1` EndpointSlices
//! of a Service with a selector list the pods it selects, at most
//! [`MAX_ENDPOINTS_PER_SLICE`] per slice.
//!
//! [`reconcile`] takes the Service (absent once deleted), the pods of its
//! namespace and the EndpointSlices of its namespace (only those labelled
//! [`SERVICE_NAME_LABEL`] = the Service and [`MANAGED_BY_LABEL`] =
//! [`MANAGED_BY`] are looked at), all from the caches. Pods are grouped by
//! address type (`IPv4`/`IPv6`, per the Service's `ipFamilies`) and by the
//! ports they resolve; each group is kept in its own slices. Churn is kept
//! low as Kubernetes' reconciler does: an existing slice keeps the
//! endpoints that remain and is updated in place, new endpoints fill the
//! room of slices already being written first, slices emptied are reused
//! before any new one is created, and a slice already right is not written.
//! A Service with no endpoints keeps one empty placeholder slice.
//!
//! Each endpoint carries the `ready`, `serving` and `terminating`
//! conditions; terminating pods are listed (not ready), finished pods and
//! pods without an IP are not. Slices are owned by the Service (an
//! ownerReference), so the garbage collector removes them once it is
//! gone (`None` asks for nothing); a Service marked for deletion has its
//! slices deleted here. A Service without a selector is left alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::action::Action;
use crate::endpoints::{
    finished, pod_ip, pod_ready, protocol, resolve_port, selected, selector, target_ref, to_json, HEADLESS_LABEL,
};

/// Names the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Names the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller, in [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Kubernetes' default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Slices of one address type and one set of ports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Group {
    address_type: String,
    /// (name, port, protocol), sorted.
    ports: Vec<(String, i32, String)>,
}

impl Group {
    fn of(slice: &EndpointSlice) -> Group {
        let mut ports: Vec<(String, i32, String)> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| {
                (p.name.clone().unwrap_or_default(), p.port.unwrap_or_default(), p.protocol.clone().unwrap_or_default())
            })
            .collect();
        ports.sort();
        Group { address_type: slice.address_type.clone(), ports }
    }

    fn endpoint_ports(&self) -> Option<Vec<EndpointPort>> {
        (!self.ports.is_empty()).then(|| {
            self.ports
                .iter()
                .map(|(name, port, protocol)| EndpointPort {
                    name: Some(name.clone()),
                    port: Some(*port),
                    protocol: Some(protocol.clone()),
                    ..Default::default()
                })
                .collect()
        })
    }
}

/// What to do about the EndpointSlices of `service` (`None`: it is gone).
pub fn reconcile(service: Option<&Service>, pods: &[Pod], slices: &[EndpointSlice]) -> Vec<Action> {
    let Some(service) = service else {
        return vec![];
    };
    let Some(name) = service.metadata.name.as_deref() else { return vec![] };
    let ours: Vec<&EndpointSlice> = slices
        .iter()
        .filter(|s| {
            let labels = s.metadata.labels.clone().unwrap_or_default();
            s.metadata.namespace == service.metadata.namespace
                && labels.get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
                && labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
        })
        .collect();
    let Some(selector) = selector(service) else { return vec![] };
    if service.metadata.deletion_timestamp.is_some() {
        return ours.into_iter().map(|s| Action::delete_of(s, None)).collect();
    }

    let mut desired = desired_endpoints(service, pods, &selector);
    let placeholder = desired.is_empty();
    if placeholder {
        desired.insert(Group { address_type: families(service)[0].clone(), ports: vec![] }, BTreeMap::new());
    }
    let labels = slice_labels(service);
    let mut existing: BTreeMap<Group, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in ours {
        existing.entry(Group::of(slice)).or_default().push(slice);
    }
    let mut actions = Vec::new();
    for (group, slices) in &existing {
        if !desired.contains_key(group) {
            actions.extend(slices.iter().map(|s| Action::delete_of(*s, None)));
        }
    }
    for (group, wanted) in desired {
        let mut slices = existing.remove(&group).unwrap_or_default();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        actions.extend(reconcile_group(service, &group, wanted, &slices, &labels, placeholder));
    }
    actions
}

/// One group's writes: update in place, fill, reuse, create, delete.
fn reconcile_group(
    service: &Service,
    group: &Group,
    mut wanted: BTreeMap<String, Endpoint>,
    slices: &[&EndpointSlice],
    labels: &BTreeMap<String, String>,
    placeholder: bool,
) -> Vec<Action> {
    // Each existing slice keeps the endpoints still wanted, as they are now.
    let mut kept: Vec<(EndpointSlice, bool)> = Vec::new(); // (slice, must be written)
    let mut emptied: Vec<EndpointSlice> = Vec::new();
    for slice in slices {
        let endpoints: Vec<Endpoint> =
            slice.endpoints.iter().filter_map(|ep| wanted.remove(&endpoint_key(ep))).collect();
        let mut next = (*slice).clone();
        let changed = endpoints != slice.endpoints || !labels_match(slice, labels);
        next.endpoints = endpoints;
        next.metadata.labels = Some(labels.clone());
        // An empty slice is kept only as the placeholder it already was.
        if next.endpoints.is_empty() && (!slice.endpoints.is_empty() || !placeholder) {
            emptied.push(next);
        } else {
            kept.push((next, changed));
        }
    }
    // New endpoints go to slices being written anyway, then to the others.
    let mut fresh: Vec<Endpoint> = wanted.into_values().collect();
    kept.sort_by_key(|(_, write)| !*write);
    for (slice, write) in kept.iter_mut() {
        let room = MAX_ENDPOINTS_PER_SLICE.saturating_sub(slice.endpoints.len());
        if room == 0 || fresh.is_empty() {
            continue;
        }
        let take = room.min(fresh.len());
        slice.endpoints.extend(fresh.drain(..take));
        *write = true;
    }
    let mut actions: Vec<Action> =
        kept.iter().filter(|(_, write)| *write).map(|(slice, _)| Action::Update(to_json(slice))).collect();
    // Then emptied slices are refilled before new ones are made.
    let mut emptied = emptied.into_iter();
    while !fresh.is_empty() {
        let take = MAX_ENDPOINTS_PER_SLICE.min(fresh.len());
        let endpoints: Vec<Endpoint> = fresh.drain(..take).collect();
        match emptied.next() {
            Some(mut slice) => {
                slice.endpoints = endpoints;
                actions.push(Action::Update(to_json(&slice)));
            }
            None => actions.push(Action::Create(to_json(&new_slice(service, group, endpoints, labels)))),
        }
    }
    let mut emptied: Vec<EndpointSlice> = emptied.collect();
    if placeholder && kept.is_empty() {
        // A Service without endpoints keeps one empty slice.
        match emptied.pop() {
            Some(slice) => actions.push(Action::Update(to_json(&slice))),
            None => actions.push(Action::Create(to_json(&new_slice(service, group, vec![], labels)))),
        }
    }
    actions.extend(emptied.iter().map(|s| Action::delete_of(s, None)));
    actions
}

fn labels_match(slice: &EndpointSlice, labels: &BTreeMap<String, String>) -> bool {
    slice.metadata.labels.as_ref() == Some(labels)
}

/// The Service's address families (`ipFamilies`, `IPv4` by default).
fn families(service: &Service) -> Vec<String> {
    let families = service.spec.as_ref().and_then(|s| s.ip_families.clone()).unwrap_or_default();
    if families.is_empty() {
        vec!["IPv4".into()]
    } else {
        families
    }
}

/// Group → endpoint key → endpoint, for every pod that belongs in a slice.
fn desired_endpoints(
    service: &Service,
    pods: &[Pod],
    selector: &BTreeMap<String, String>,
) -> BTreeMap<Group, BTreeMap<String, Endpoint>> {
    let spec = service.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let service_ports = spec.ports.clone().unwrap_or_default();
    let families = families(service);
    let mut desired: BTreeMap<Group, BTreeMap<String, Endpoint>> = BTreeMap::new();
    for pod in selected(pods, service, selector) {
        if finished(pod) || pod_ip(pod).is_none() {
            continue;
        }
        let mut ports: Vec<(String, i32, String)> = service_ports
            .iter()
            .filter_map(|sp| resolve_port(pod, sp).map(|p| (sp.name.clone().unwrap_or_default(), p, protocol(sp))))
            .collect();
        if ports.is_empty() && !service_ports.is_empty() {
            continue;
        }
        ports.sort();
        let serving = pod_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let conditions = EndpointConditions {
            ready: Some(publish_not_ready || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        };
        let pod_spec = pod.spec.as_ref();
        let hostname = pod_spec
            .filter(|s| s.subdomain.is_some() && s.subdomain == service.metadata.name)
            .and_then(|s| s.hostname.clone());
        for ip in pod_ips(pod) {
            let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
            if !families.iter().any(|f| f == family) {
                continue;
            }
            let endpoint = Endpoint {
                addresses: vec![ip.clone()],
                conditions: Some(conditions.clone()),
                hostname: hostname.clone(),
                node_name: pod_spec.and_then(|s| s.node_name.clone()),
                target_ref: Some(target_ref(pod)),
                ..Default::default()
            };
            let group = Group { address_type: family.into(), ports: ports.clone() };
            desired.entry(group).or_default().insert(endpoint_key(&endpoint), endpoint);
        }
    }
    desired
}

/// `status.podIPs`, or `status.podIP` alone.
fn pod_ips(pod: &Pod) -> Vec<String> {
    let listed: Vec<String> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|ip| ip.ip.clone()).filter(|ip| !ip.is_empty()).collect())
        .unwrap_or_default();
    if listed.is_empty() {
        pod_ip(pod).map(|ip| vec![ip.to_string()]).unwrap_or_default()
    } else {
        listed
    }
}

/// Which pod an endpoint stands for: its uid and address.
fn endpoint_key(endpoint: &Endpoint) -> String {
    let pod = endpoint.target_ref.as_ref().and_then(|r| r.uid.clone()).unwrap_or_default();
    format!("{pod}/{}", endpoint.addresses.join(","))
}

fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), service.metadata.name.clone().unwrap_or_default());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let headless = service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    if headless {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    } else {
        labels.remove(HEADLESS_LABEL);
    }
    labels
}

fn new_slice(
    service: &Service,
    group: &Group,
    endpoints: Vec<Endpoint>,
    labels: &BTreeMap<String, String>,
) -> EndpointSlice {
    let mut slice = EndpointSlice {
        address_type: group.address_type.clone(),
        endpoints,
        ports: group.endpoint_ports(),
        ..Default::default()
    };
    let name = service.metadata.name.clone().unwrap_or_default();
    slice.metadata.generate_name = Some(format!("{name}-"));
    slice.metadata.namespace = service.metadata.namespace.clone();
    slice.metadata.labels = Some(labels.clone());
    slice.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name,
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    slice
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::{json, Value};

    use super::*;
    use crate::endpoints::tests::{pod, port, service};

    const APP: &[(&str, &str)] = &[("app", "web")];

    fn web() -> Service {
        service(Some(APP), vec![port("http", 80, IntOrString::String("http".into()))])
    }

    fn pods(n: usize) -> Vec<Pod> {
        (0..n).map(|i| pod(&format!("p{i:03}"), Some(&format!("10.0.{}.{}", i / 250, i % 250 + 1)), true)).collect()
    }

    /// What the apiserver would store for the writes: names for created slices.
    fn stored(actions: &[Action]) -> Vec<EndpointSlice> {
        actions
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Action::Create(obj) => {
                    let mut obj = obj.clone();
                    obj["metadata"]["name"] = json!(format!("web-{i}"));
                    Some(serde_json::from_value(obj).unwrap())
                }
                _ => None,
            })
            .collect()
    }

    fn writes(actions: &[Action]) -> Vec<Value> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create(obj) | Action::Update(obj) => Some(obj.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_slice_lists_pods_with_conditions_labels_ports_and_owner() {
        let mut leaving = pod("leaving", Some("10.0.0.9"), true);
        leaving.metadata.deletion_timestamp = Some(Time(chrono::Utc::now()));
        let actions = reconcile(
            Some(&web()),
            &[pod("a", Some("10.0.0.1"), true), pod("b", Some("10.0.0.2"), false), leaving],
            &[],
        );
        let [Action::Create(slice)] = &actions[..] else { panic!("{actions:?}") };
        assert_eq!(slice["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(slice["kind"], "EndpointSlice");
        assert_eq!(slice["metadata"]["generateName"], "web-");
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(slice["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "svc-uid");
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(slice["ports"], json!([{"name": "http", "port": 8080, "protocol": "TCP"}]));
        let eps = slice["endpoints"].as_array().unwrap();
        let conditions: Vec<(&Value, &Value)> = eps.iter().map(|e| (&e["addresses"][0], &e["conditions"])).collect();
        assert_eq!(
            conditions,
            vec![
                (&json!("10.0.0.1"), &json!({"ready": true, "serving": true, "terminating": false})),
                (&json!("10.0.0.2"), &json!({"ready": false, "serving": false, "terminating": false})),
                (&json!("10.0.0.9"), &json!({"ready": false, "serving": true, "terminating": true})),
            ]
        );
        assert_eq!(eps[0]["nodeName"], "node-1");
        assert_eq!(eps[0]["targetRef"]["name"], "a");
    }

    #[test]
    fn no_slice_holds_more_than_a_hundred_endpoints() {
        let actions = reconcile(Some(&web()), &pods(250), &[]);
        let sizes: Vec<usize> = writes(&actions).iter().map(|s| s["endpoints"].as_array().unwrap().len()).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
    }

    #[test]
    fn slices_already_right_are_not_written() {
        let all = pods(150);
        let slices = stored(&reconcile(Some(&web()), &all, &[]));
        assert!(reconcile(Some(&web()), &all, &slices).is_empty());
    }

    #[test]
    fn a_new_pod_fills_an_existing_slice_in_place() {
        let mut all = pods(150);
        let slices = stored(&reconcile(Some(&web()), &all, &[]));
        all.push(pod("new", Some("10.9.9.9"), true));
        let actions = reconcile(Some(&web()), &all, &slices);
        let [Action::Update(slice)] = &actions[..] else { panic!("one update, no create: {actions:?}") };
        assert_eq!(slice["endpoints"].as_array().unwrap().len(), 51);
    }

    #[test]
    fn a_pod_that_turns_ready_updates_only_its_slice() {
        let mut all = pods(150);
        all[120].status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        let slices = stored(&reconcile(Some(&web()), &all, &[]));
        all[120].status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        let actions = reconcile(Some(&web()), &all, &slices);
        let [Action::Update(slice)] = &actions[..] else { panic!("{actions:?}") };
        assert_eq!(slice["metadata"]["name"], slices[1].metadata.name.clone().unwrap());
    }

    #[test]
    fn an_emptied_slice_is_reused_or_deleted() {
        let all = pods(150);
        let slices = stored(&reconcile(Some(&web()), &all, &[]));
        let actions = reconcile(Some(&web()), &all[..100], &slices);
        assert!(
            matches!(&actions[..], [Action::Delete { kind, name, .. }] if kind == "EndpointSlice" && name == "web-1"),
            "{actions:?}"
        );
    }

    #[test]
    fn a_service_without_endpoints_keeps_one_empty_placeholder() {
        let actions = reconcile(Some(&web()), &[], &[]);
        let [Action::Create(slice)] = &actions[..] else { panic!("{actions:?}") };
        assert_eq!(slice["endpoints"], json!([]));
        let placeholder = stored(&actions);
        assert!(reconcile(Some(&web()), &[], &placeholder).is_empty());
        // Once pods come, the placeholder's group is not theirs: it goes.
        let actions = reconcile(Some(&web()), &pods(1), &placeholder);
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert!(matches!(&actions[0], Action::Delete { .. }));
        assert!(matches!(&actions[1], Action::Create(_)));
    }

    #[test]
    fn slices_of_others_and_services_without_selector_are_left_alone() {
        let mut foreign = stored(&reconcile(Some(&web()), &pods(1), &[]));
        foreign[0].metadata.labels.as_mut().unwrap().insert(MANAGED_BY_LABEL.into(), "someone-else".into());
        let actions = reconcile(Some(&web()), &pods(1), &foreign);
        assert!(matches!(&actions[..], [Action::Create(_)]), "the foreign slice is not ours to update: {actions:?}");
        let selectorless = service(None, vec![port("http", 80, IntOrString::Int(80))]);
        assert!(reconcile(Some(&selectorless), &pods(3), &[]).is_empty());
    }
}
