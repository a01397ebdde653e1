//! The endpoints controller: the `Endpoints` object of a Service with a
//! selector lists the pods it selects.
//!
//! [`reconcile`] takes the Service (absent once deleted), the pods of its
//! namespace and the Endpoints of the same name, all from the caches, and
//! returns the write that makes the Endpoints match: ready pods under
//! `addresses`, the others under `notReadyAddresses` (or all under
//! `addresses` with `publishNotReadyAddresses`), grouped into subsets of
//! pods that share the same resolved ports. A pod without an IP, finished
//! (`Succeeded`/`Failed`) or being deleted is left out (a terminating one
//! is kept with `publishNotReadyAddresses`). A Service without a selector
//! is left alone: its Endpoints belong to whoever wrote them.
//!
//! The wiring reconciles a Service on its own events and on those of the
//! pods it selects (old and new labels) in its namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::action::Action;

/// The label Kubernetes puts on the Endpoints of a headless Service.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// What to do about the Endpoints of `service` (`None`: the Service is
/// gone, and so should its Endpoints be).
pub fn reconcile(service: Option<&Service>, pods: &[Pod], current: Option<&Endpoints>) -> Vec<Action> {
    let Some(service) = service else {
        return current.map(|ep| vec![Action::delete_of(ep, None)]).unwrap_or_default();
    };
    let Some(selector) = selector(service) else { return vec![] };
    if service.metadata.deletion_timestamp.is_some() {
        return vec![];
    }
    let spec = service.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let service_ports = spec.ports.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");

    // Resolved ports (sorted) → (ready, not ready) addresses.
    let mut subsets: BTreeMap<Vec<PortKey>, (Vec<EndpointAddress>, Vec<EndpointAddress>)> = BTreeMap::new();
    for pod in selected(pods, service, &selector) {
        let Some(ip) = pod_ip(pod) else { continue };
        if finished(pod) || (pod.metadata.deletion_timestamp.is_some() && !publish_not_ready) {
            continue;
        }
        let mut ports: Vec<PortKey> = Vec::new();
        for sp in &service_ports {
            if let Some(port) = resolve_port(pod, sp) {
                ports.push(PortKey { name: sp.name.clone(), port, protocol: protocol(sp) });
            }
        }
        if ports.is_empty() && !(service_ports.is_empty() && headless) {
            // No port resolves on this pod: it serves nothing here.
            continue;
        }
        ports.sort();
        let address = address(pod, ip, service);
        let entry = subsets.entry(ports).or_default();
        if publish_not_ready || pod_ready(pod) {
            entry.0.push(address);
        } else {
            entry.1.push(address);
        }
    }
    let subsets: Vec<EndpointSubset> = subsets
        .into_iter()
        .map(|(ports, (mut ready, mut not_ready))| {
            ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            not_ready.sort_by(|a, b| a.ip.cmp(&b.ip));
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then(|| ports.into_iter().map(PortKey::into_port).collect()),
            }
        })
        .collect();

    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    if headless {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    } else {
        labels.remove(HEADLESS_LABEL);
    }
    let subsets = (!subsets.is_empty()).then_some(subsets);
    match current {
        Some(ep) if ep.subsets == subsets && ep.metadata.labels.clone().unwrap_or_default() == labels => vec![],
        Some(ep) => {
            let mut next = ep.clone();
            next.subsets = subsets;
            next.metadata.labels = Some(labels);
            vec![Action::Update(to_json(&next))]
        }
        None => {
            let mut ep = Endpoints::default();
            ep.metadata.name = service.metadata.name.clone();
            ep.metadata.namespace = service.metadata.namespace.clone();
            ep.metadata.labels = Some(labels);
            ep.subsets = subsets;
            vec![Action::Create(to_json(&ep))]
        }
    }
}

/// A resolved port, ordered so that equal port sets compare equal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortKey {
    name: Option<String>,
    port: i32,
    protocol: String,
}

impl PortKey {
    fn into_port(self) -> EndpointPort {
        EndpointPort { name: self.name, port: self.port, protocol: Some(self.protocol), ..Default::default() }
    }
}

pub(crate) fn to_json<T: serde::Serialize>(obj: &T) -> Value {
    // k8s-openapi objects always serialize (apiVersion and kind included).
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

/// The Service's selector; `None` for a Service without one.
pub(crate) fn selector(service: &Service) -> Option<BTreeMap<String, String>> {
    service.spec.as_ref()?.selector.clone().filter(|s| !s.is_empty())
}

/// The pods of the Service's namespace its selector matches.
pub(crate) fn selected<'a>(
    pods: &'a [Pod],
    service: &'a Service,
    selector: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = &'a Pod> {
    pods.iter().filter(move |pod| {
        pod.metadata.namespace == service.metadata.namespace && {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        }
    })
}

pub(crate) fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.pod_ip.as_deref().filter(|ip| !ip.is_empty())
}

/// `Succeeded` or `Failed`: its containers will not run again.
pub(crate) fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
}

/// The pod's `Ready` condition is `True`.
pub(crate) fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn protocol(port: &ServicePort) -> String {
    port.protocol.clone().unwrap_or_else(|| "TCP".into())
}

/// The pod's port for a Service port: `targetPort` as a number, or the
/// container port of that name (and protocol); `port` without a
/// `targetPort`. `None` when the named port is not on the pod.
pub(crate) fn resolve_port(pod: &Pod, service_port: &ServicePort) -> Option<i32> {
    match &service_port.target_port {
        None => Some(service_port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            let wanted = protocol(service_port);
            pod.spec.as_ref()?.containers.iter().flat_map(|c| c.ports.iter().flatten()).find_map(|p| {
                (p.name.as_deref() == Some(name.as_str())
                    && p.protocol.clone().unwrap_or_else(|| "TCP".into()) == wanted)
                    .then_some(p.container_port)
            })
        }
    }
}

/// The reference to a pod that endpoints carry.
pub(crate) fn target_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

fn address(pod: &Pod, ip: &str, service: &Service) -> EndpointAddress {
    let spec = pod.spec.as_ref();
    // A pod whose subdomain is the Service's name is reachable under its
    // hostname in the Service's DNS zone.
    let hostname =
        spec.filter(|s| s.subdomain.is_some() && s.subdomain == service.metadata.name).and_then(|s| s.hostname.clone());
    EndpointAddress {
        ip: ip.to_string(),
        hostname,
        node_name: spec.and_then(|s| s.node_name.clone()),
        target_ref: Some(target_ref(pod)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodCondition, PodSpec, PodStatus, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    pub(crate) fn service(selector: Option<&[(&str, &str)]>, ports: Vec<ServicePort>) -> Service {
        let mut svc = Service::default();
        svc.metadata.name = Some("web".into());
        svc.metadata.namespace = Some("default".into());
        svc.metadata.uid = Some("svc-uid".into());
        svc.spec = Some(ServiceSpec {
            selector: selector.map(|s| s.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ports: Some(ports),
            cluster_ip: Some("10.96.0.10".into()),
            ..Default::default()
        });
        svc
    }

    pub(crate) fn port(name: &str, port: i32, target: IntOrString) -> ServicePort {
        ServicePort { name: Some(name.into()), port, target_port: Some(target), ..Default::default() }
    }

    pub(crate) fn pod(name: &str, ip: Option<&str>, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        pod.spec = Some(PodSpec {
            node_name: Some("node-1".into()),
            containers: vec![Container {
                name: "c".into(),
                ports: Some(vec![ContainerPort {
                    name: Some("http".into()),
                    container_port: 8080,
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        });
        pod.status = Some(PodStatus {
            pod_ip: ip.map(str::to_string),
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    fn written(actions: &[Action]) -> Value {
        match actions {
            [Action::Create(obj)] | [Action::Update(obj)] => obj.clone(),
            other => panic!("expected one write, got {other:?}"),
        }
    }

    const APP: &[(&str, &str)] = &[("app", "web")];

    #[test]
    fn ready_and_not_ready_pods_are_listed_apart_with_named_ports_resolved() {
        let svc = service(Some(APP), vec![port("http", 80, IntOrString::String("http".into()))]);
        let pods =
            [pod("b", Some("10.0.0.2"), true), pod("a", Some("10.0.0.1"), true), pod("c", Some("10.0.0.3"), false)];
        let ep = written(&reconcile(Some(&svc), &pods, None));
        assert_eq!(ep["kind"], "Endpoints");
        assert_eq!(ep["metadata"]["name"], "web");
        let subset = &ep["subsets"][0];
        assert_eq!(subset["addresses"][0]["ip"], "10.0.0.1");
        assert_eq!(subset["addresses"][1]["ip"], "10.0.0.2");
        assert_eq!(subset["addresses"][0]["nodeName"], "node-1");
        assert_eq!(
            subset["addresses"][0]["targetRef"],
            json!({"kind": "Pod", "namespace": "default", "name": "a", "uid": "uid-a"})
        );
        assert_eq!(subset["notReadyAddresses"][0]["ip"], "10.0.0.3");
        assert_eq!(subset["ports"], json!([{"name": "http", "port": 8080, "protocol": "TCP"}]));
    }

    #[test]
    fn pods_without_ip_finished_or_terminating_are_left_out() {
        let svc = service(Some(APP), vec![port("http", 80, IntOrString::Int(8080))]);
        let mut done = pod("done", Some("10.0.0.2"), false);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut leaving = pod("leaving", Some("10.0.0.3"), true);
        leaving.metadata.deletion_timestamp = Some(Time(chrono::Utc::now()));
        let mut other = pod("other", Some("10.0.0.4"), true);
        other.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
        let pods = [pod("no-ip", None, true), done, leaving.clone(), other, pod("ok", Some("10.0.0.1"), true)];
        let ep = written(&reconcile(Some(&svc), &pods, None));
        assert_eq!(ep["subsets"].as_array().unwrap().len(), 1);
        assert_eq!(ep["subsets"][0]["addresses"].as_array().unwrap().len(), 1);
        assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "10.0.0.1");

        let mut publish = svc.clone();
        publish.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let ep = written(&reconcile(Some(&publish), &[leaving], None));
        assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "10.0.0.3", "published although terminating");
    }

    #[test]
    fn pods_resolving_ports_differently_land_in_different_subsets() {
        let svc = service(Some(APP), vec![port("http", 80, IntOrString::String("http".into()))]);
        let mut other = pod("b", Some("10.0.0.2"), true);
        other.spec.as_mut().unwrap().containers[0].ports.as_mut().unwrap()[0].container_port = 9090;
        let mut unnamed = pod("c", Some("10.0.0.3"), true);
        unnamed.spec.as_mut().unwrap().containers[0].ports = None;
        let ep = written(&reconcile(Some(&svc), &[pod("a", Some("10.0.0.1"), true), other, unnamed], None));
        let subsets = ep["subsets"].as_array().unwrap();
        assert_eq!(subsets.len(), 2, "{subsets:?}");
        assert_eq!(subsets[0]["ports"][0]["port"], 8080);
        assert_eq!(subsets[1]["ports"][0]["port"], 9090);
    }

    #[test]
    fn a_service_without_selector_is_left_alone() {
        let svc = service(None, vec![port("http", 80, IntOrString::Int(80))]);
        assert!(reconcile(Some(&svc), &[pod("a", Some("10.0.0.1"), true)], None).is_empty());
    }

    #[test]
    fn endpoints_already_right_are_not_written_and_stale_ones_are_updated() {
        let svc = service(Some(APP), vec![port("http", 80, IntOrString::Int(8080))]);
        let pods = [pod("a", Some("10.0.0.1"), true)];
        let mut ep: Endpoints = serde_json::from_value(written(&reconcile(Some(&svc), &pods, None))).unwrap();
        ep.metadata.resource_version = Some("9".into());
        assert!(reconcile(Some(&svc), &pods, Some(&ep)).is_empty());
        let update = written(&reconcile(Some(&svc), &[], Some(&ep)));
        assert_eq!(update["metadata"]["resourceVersion"], "9");
        assert!(update.get("subsets").is_none(), "no pods, no subsets: {update}");
    }

    #[test]
    fn the_endpoints_of_a_deleted_service_are_deleted() {
        let mut ep = Endpoints::default();
        ep.metadata.name = Some("web".into());
        ep.metadata.namespace = Some("default".into());
        let actions = reconcile(None, &[], Some(&ep));
        assert!(matches!(&actions[..], [Action::Delete { kind, name, .. }] if kind == "Endpoints" && name == "web"));
    }
}
