//! The remaining kinds: ConfigMap, Secret, Lease, Namespace, Node,
//! Endpoints, EndpointSlice, ResourceQuota, LimitRange and Event.

use std::collections::BTreeSet;

use serde_json::Value;

use super::names::{
    is_config_map_key, is_dns1123_label, is_dns1123_subdomain, is_ip, is_label_value, is_qualified_name, INVALID_IP,
};
use super::pod::{one_of, port_num_errors, validate_taint_effect, PORT_PROTOCOLS};
use super::quantity::{Quantity, QUANTITY_FORMAT};
use super::{get, get_arr, get_i64, get_obj, get_str, invalid_each, same, IMMUTABLE, IS_NEGATIVE};
use crate::field::{FieldError, Path};

/// ConfigMaps and Secrets hold at most 1 MiB of data.
pub(crate) const MAX_DATA_SIZE: usize = 1024 * 1024;
const IMMUTABLE_WHEN_SET: &str = "field is immutable when `immutable` is set";

/// The decoded length of standard base64 text.
fn base64_decoded_len(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|c| *c == b'=').count();
    (s.len() / 4 * 3).saturating_sub(pad)
}

fn data_keys(field: &str, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for key in get_obj(obj, field).into_iter().flat_map(|m| m.keys()) {
        errs.extend(invalid_each(&Path::new(field).key(key), key, is_config_map_key(key)));
    }
    errs
}

fn data_size(field: &str, obj: &Value, base64: bool) -> usize {
    get_obj(obj, field)
        .into_iter()
        .flat_map(|m| m.values())
        .map(|v| v.as_str().map_or(0, |s| if base64 { base64_decoded_len(s) } else { s.len() }))
        .fold(0usize, usize::saturating_add)
}

/// Once `immutable: true` is stored, it stays and the data may not change.
fn immutable_data(obj: &Value, old: Option<&Value>, fields: &[&str]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(old) = old else { return errs };
    if get(old, "immutable").as_bool() != Some(true) {
        return errs;
    }
    if get(obj, "immutable").as_bool() != Some(true) {
        errs.push(FieldError::forbidden("immutable", IMMUTABLE_WHEN_SET));
    }
    for field in fields {
        if !same(get(obj, field), get(old, field)) {
            errs.push(FieldError::forbidden(*field, IMMUTABLE_WHEN_SET));
        }
    }
    errs
}

pub(crate) fn validate_config_map(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = immutable_data(obj, old, &["data", "binaryData"]);
    errs.extend(data_keys("data", obj));
    errs.extend(data_keys("binaryData", obj));
    if let (Some(data), Some(binary)) = (get_obj(obj, "data"), get_obj(obj, "binaryData")) {
        for key in data.keys().filter(|k| binary.contains_key(*k)) {
            errs.push(FieldError::invalid(
                Path::new("data").key(key),
                &Value::String(key.clone()),
                "duplicate of key present in binaryData",
            ));
        }
    }
    if data_size("data", obj, false).saturating_add(data_size("binaryData", obj, true)) > MAX_DATA_SIZE {
        errs.push(FieldError::too_long("", MAX_DATA_SIZE));
    }
    errs
}

pub(crate) fn validate_secret(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = immutable_data(obj, old, &["data"]);
    errs.extend(data_keys("data", obj));
    if data_size("data", obj, true) > MAX_DATA_SIZE {
        errs.push(FieldError::too_long("data", MAX_DATA_SIZE));
    }
    let ty = get_str(obj, "type");
    let data = get(obj, "data");
    let require = |key: &str, errs: &mut Vec<FieldError>| {
        if data.get(key).is_none() {
            errs.push(FieldError::required(Path::new("data").key(key), ""));
        }
    };
    match ty {
        "" => errs.push(FieldError::required("type", "")),
        "kubernetes.io/service-account-token" => {
            let sa = get_str(get(get(obj, "metadata"), "annotations"), "kubernetes.io/service-account.name");
            if sa.is_empty() {
                errs.push(FieldError::required(
                    Path::new("metadata").child("annotations").key("kubernetes.io/service-account.name"),
                    "",
                ));
            }
        }
        "kubernetes.io/dockercfg" => require(".dockercfg", &mut errs),
        "kubernetes.io/dockerconfigjson" => require(".dockerconfigjson", &mut errs),
        "kubernetes.io/ssh-auth" => require("ssh-privatekey", &mut errs),
        "kubernetes.io/tls" => {
            require("tls.crt", &mut errs);
            require("tls.key", &mut errs);
        }
        _ => {}
    }
    if let Some(old) = old {
        if get_str(old, "type") != ty {
            errs.push(FieldError::invalid("type", get(obj, "type"), IMMUTABLE));
        }
    }
    errs
}

pub(crate) fn validate_lease(obj: &Value) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    if let Some(n) = get_i64(spec, "leaseDurationSeconds").filter(|n| *n <= 0) {
        errs.push(FieldError::invalid(path.child("leaseDurationSeconds"), &Value::from(n), "must be greater than 0"));
    }
    if let Some(n) = get_i64(spec, "leaseTransitions").filter(|n| *n < 0) {
        errs.push(FieldError::invalid(path.child("leaseTransitions"), &Value::from(n), IS_NEGATIVE));
    }
    errs
}

pub(crate) fn validate_namespace(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let path = Path::new("spec").child("finalizers");
    for f in get_arr(get(obj, "spec"), "finalizers") {
        let f = f.as_str().unwrap_or("");
        let msgs = is_qualified_name(f);
        if !msgs.is_empty() {
            errs.extend(invalid_each(&path, f, msgs));
        } else if !f.contains('/') && f != "kubernetes" {
            errs.extend(invalid_each(
                &path,
                f,
                vec!["name is neither a standard finalizer name nor is it fully qualified".into()],
            ));
        }
    }
    let phase = get(get(obj, "status"), "phase");
    if phase.as_str().is_some_and(|p| !p.is_empty() && p != "Active" && p != "Terminating") {
        errs.push(FieldError::not_supported("status.phase", phase, &["Active", "Terminating"]));
    }
    errs
}

pub(crate) fn validate_node(obj: &Value) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, t) in get_arr(spec, "taints").iter().enumerate() {
        let p = path.child("taints").index(i);
        let key = get_str(t, "key");
        errs.extend(invalid_each(&p.child("key"), key, is_qualified_name(key)));
        let value = get_str(t, "value");
        let msgs = is_label_value(value);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(p.child("value"), get(t, "value"), msgs.join(";")));
        }
        errs.extend(validate_taint_effect(t, &p.child("effect")));
        if !seen.insert((key.to_string(), get_str(t, "effect").to_string())) {
            let mut e = FieldError::duplicate(&p, t);
            e.detail = "taints must be unique by key and effect pair".into();
            errs.push(e);
        }
    }
    errs.extend(quantity_map(get(get(obj, "status"), "capacity"), &Path::new("status").child("capacity")));
    errs.extend(quantity_map(get(get(obj, "status"), "allocatable"), &Path::new("status").child("allocatable")));
    errs
}

const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN"];
const MAX_SLICE_ENDPOINTS: usize = 1000;
const MAX_ENDPOINT_ADDRESSES: usize = 100;
const MAX_SLICE_PORTS: usize = 100;

/// Kubernetes' `ValidateEndpointSlice` (+ `ValidateEndpointSliceUpdate`).
pub(crate) fn validate_endpoint_slice(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let address_type = get_str(obj, "addressType");
    errs.extend(one_of(obj, "addressType", ADDRESS_TYPES, &Path::new("addressType")));
    if let Some(old) = old {
        if !same(get(obj, "addressType"), get(old, "addressType")) {
            errs.push(FieldError::invalid("addressType", get(obj, "addressType"), IMMUTABLE));
        }
    }
    let endpoints = get_arr(obj, "endpoints");
    if endpoints.len() > MAX_SLICE_ENDPOINTS {
        errs.push(FieldError::forbidden("endpoints", format!("must have at most {MAX_SLICE_ENDPOINTS} items")));
    }
    for (i, ep) in endpoints.iter().enumerate() {
        let p = Path::new("endpoints").index(i);
        let addresses = get_arr(ep, "addresses");
        if addresses.is_empty() {
            errs.push(FieldError::required(p.child("addresses"), "must contain at least 1 address"));
        } else if addresses.len() > MAX_ENDPOINT_ADDRESSES {
            errs.push(FieldError::forbidden(
                p.child("addresses"),
                format!("must have at most {MAX_ENDPOINT_ADDRESSES} items"),
            ));
        }
        for (j, a) in addresses.iter().enumerate() {
            let ap = p.child("addresses").index(j);
            let text = a.as_str().unwrap_or_default();
            let family_ok = match address_type {
                "IPv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
                "IPv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
                "FQDN" => is_dns1123_subdomain(text).is_empty(),
                _ => true,
            };
            if !family_ok {
                errs.push(FieldError::invalid(&ap, a, format!("must be a valid {address_type} address")));
            }
        }
        let hostname = get_str(ep, "hostname");
        if !hostname.is_empty() {
            errs.extend(invalid_each(&p.child("hostname"), hostname, is_dns1123_label(hostname)));
        }
        let node = get_str(ep, "nodeName");
        if !node.is_empty() {
            errs.extend(invalid_each(&p.child("nodeName"), node, is_dns1123_subdomain(node)));
        }
    }
    let ports = get_arr(obj, "ports");
    if ports.len() > MAX_SLICE_PORTS {
        errs.push(FieldError::forbidden("ports", format!("must have at most {MAX_SLICE_PORTS} items")));
    }
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let pp = Path::new("ports").index(i);
        let name = get_str(port, "name");
        if !name.is_empty() {
            errs.extend(invalid_each(&pp.child("name"), name, is_dns1123_label(name)));
        }
        if !names.insert(name) {
            errs.push(FieldError::duplicate(pp.child("name"), get(port, "name")));
        }
        if let Some(n) = get_i64(port, "port") {
            errs.extend(port_num_errors(n, &pp.child("port")));
        }
        errs.extend(one_of(port, "protocol", PORT_PROTOCOLS, &pp.child("protocol")));
    }
    errs
}

pub(crate) fn validate_endpoints(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, ss) in get_arr(obj, "subsets").iter().enumerate() {
        let p = Path::new("subsets").index(i);
        let (ready, not_ready) = (get_arr(ss, "addresses"), get_arr(ss, "notReadyAddresses"));
        if ready.is_empty() && not_ready.is_empty() {
            errs.push(FieldError::required(&p, "must specify `addresses` or `notReadyAddresses`"));
        }
        for (field, addrs) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            for (j, a) in addrs.iter().enumerate() {
                let ap = p.child(field).index(j);
                let ip = get_str(a, "ip");
                if ip.is_empty() {
                    errs.push(FieldError::required(ap.child("ip"), ""));
                } else if !is_ip(ip) {
                    errs.push(FieldError::invalid(ap.child("ip"), get(a, "ip"), INVALID_IP));
                }
                let hostname = get_str(a, "hostname");
                if !hostname.is_empty() {
                    errs.extend(invalid_each(&ap.child("hostname"), hostname, is_dns1123_label(hostname)));
                }
                let node = get_str(a, "nodeName");
                if !node.is_empty() {
                    errs.extend(invalid_each(&ap.child("nodeName"), node, is_dns1123_subdomain(node)));
                }
            }
        }
        let ports = get_arr(ss, "ports");
        for (j, port) in ports.iter().enumerate() {
            let pp = p.child("ports").index(j);
            let name = get_str(port, "name");
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(pp.child("name"), ""));
            } else if !name.is_empty() {
                errs.extend(invalid_each(&pp.child("name"), name, is_dns1123_label(name)));
            }
            errs.extend(port_num_errors(get_i64(port, "port").unwrap_or(0), &pp.child("port")));
            errs.extend(one_of(port, "protocol", PORT_PROTOCOLS, &pp.child("protocol")));
        }
    }
    errs
}

/// Resources counted as whole objects: their quantities must be integers.
fn is_integer_resource(name: &str) -> bool {
    matches!(
        name,
        "pods"
            | "services"
            | "replicationcontrollers"
            | "resourcequotas"
            | "secrets"
            | "configmaps"
            | "persistentvolumeclaims"
            | "services.nodeports"
            | "services.loadbalancers"
    ) || name.starts_with("count/")
}

/// Each entry: a qualified resource name and a non-negative quantity.
fn quantity_map(map: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (name, q) in map.as_object().into_iter().flatten() {
        let p = path.key(name);
        errs.extend(invalid_each(&p, name, is_qualified_name(name)));
        match q.as_str().and_then(Quantity::parse) {
            None => errs.push(FieldError::invalid(&p, q, QUANTITY_FORMAT)),
            Some(v) if v.is_negative() => errs.push(FieldError::invalid(&p, q, IS_NEGATIVE)),
            Some(v) if is_integer_resource(name) && !v.is_integer() => {
                errs.push(FieldError::invalid(&p, q, "must be an integer"))
            }
            Some(_) => {}
        }
    }
    errs
}

pub(crate) fn validate_resource_quota(obj: &Value) -> Vec<FieldError> {
    let mut errs = quantity_map(get(get(obj, "spec"), "hard"), &Path::new("spec").child("hard"));
    errs.extend(quantity_map(get(get(obj, "status"), "hard"), &Path::new("status").child("hard")));
    errs.extend(quantity_map(get(get(obj, "status"), "used"), &Path::new("status").child("used")));
    for (i, scope) in get_arr(get(obj, "spec"), "scopes").iter().enumerate() {
        const SCOPES: &[&str] = &[
            "BestEffort",
            "CrossNamespacePodAffinity",
            "NotBestEffort",
            "NotTerminating",
            "PriorityClass",
            "Terminating",
        ];
        if !scope.as_str().is_some_and(|s| SCOPES.contains(&s)) {
            errs.push(FieldError::not_supported(Path::new("spec").child("scopes").index(i), scope, SCOPES));
        }
    }
    errs
}

pub(crate) fn validate_limit_range(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let path = Path::new("spec").child("limits");
    let mut types = BTreeSet::new();
    for (i, item) in get_arr(get(obj, "spec"), "limits").iter().enumerate() {
        let p = path.index(i);
        let ty = get_str(item, "type");
        let type_errs = is_qualified_name(ty);
        if !type_errs.is_empty() {
            errs.extend(invalid_each(&p.child("type"), ty, type_errs));
        } else if !ty.contains('/') && !matches!(ty, "Pod" | "Container" | "PersistentVolumeClaim") {
            errs.push(FieldError::invalid(
                p.child("type"),
                get(item, "type"),
                "must be a standard limit type or fully qualified",
            ));
        }
        if !types.insert(ty.to_string()) {
            errs.push(FieldError::duplicate(p.child("type"), get(item, "type")));
        }
        for field in ["max", "min", "default", "defaultRequest", "maxLimitRequestRatio"] {
            errs.extend(quantity_map(get(item, field), &p.child(field)));
        }
        if ty == "Pod" {
            for field in ["default", "defaultRequest"] {
                if get_obj(item, field).is_some_and(|m| !m.is_empty()) {
                    errs.push(FieldError::forbidden(p.child(field), "may not be specified when `type` is 'Pod'"));
                }
            }
        }
        // min <= defaultRequest <= default <= max, per resource.
        let q = |field: &str, res: &str| get(get(item, field), res).as_str().and_then(Quantity::parse);
        let shown = |field: &str, res: &str| get_str(get(item, field), res).to_string();
        let mut resources: BTreeSet<&String> = BTreeSet::new();
        for field in ["max", "min", "default", "defaultRequest"] {
            resources.extend(get_obj(item, field).into_iter().flat_map(|m| m.keys()));
        }
        let pairs = [
            ("min", "max", "min", "min value {a} is greater than max value {b}"),
            ("min", "defaultRequest", "defaultRequest", "min value {a} is greater than default request value {b}"),
            ("defaultRequest", "max", "defaultRequest", "default request value {a} is greater than max value {b}"),
            (
                "defaultRequest",
                "default",
                "defaultRequest",
                "default request value {a} is greater than default limit value {b}",
            ),
            ("min", "default", "default", "min value {a} is greater than default value {b}"),
            ("default", "max", "default", "default value {a} is greater than max value {b}"),
        ];
        for res in resources {
            for (lo, hi, at, msg) in pairs {
                if let (Some(a), Some(b)) = (q(lo, res), q(hi, res)) {
                    if a.cmp(&b) == std::cmp::Ordering::Greater {
                        let msg = msg.replace("{a}", &shown(lo, res)).replace("{b}", &shown(hi, res));
                        errs.push(FieldError::invalid(p.child(at).key(res), get(get(item, at), res), msg));
                    }
                }
            }
        }
    }
    errs
}

pub(crate) fn validate_event(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let involved = get(obj, "involvedObject");
    let path = Path::new("involvedObject");
    for field in ["kind", "name"] {
        if get_str(involved, field).is_empty() {
            errs.push(FieldError::required(path.child(field), ""));
        }
    }
    let namespace = get_str(get(obj, "metadata"), "namespace");
    let involved_ns = get_str(involved, "namespace");
    let mismatch = if involved_ns.is_empty() {
        !namespace.is_empty() && namespace != "default" && namespace != "kube-system"
    } else {
        namespace != involved_ns
    };
    if mismatch {
        errs.push(FieldError::invalid(
            path.child("namespace"),
            get(involved, "namespace"),
            "does not match event.namespace",
        ));
    }
    if let Some(n) = get_i64(obj, "count").filter(|n| *n < 0) {
        errs.push(FieldError::invalid("count", &Value::from(n), IS_NEGATIVE));
    }
    let ty = get(obj, "type");
    if ty.as_str().is_some_and(|t| !t.is_empty() && t != "Normal" && t != "Warning") {
        errs.push(FieldError::not_supported("type", ty, &["Normal", "Warning"]));
    }
    errs
}
