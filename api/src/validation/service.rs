//! Services: Kubernetes' `ValidateService` and the `clusterIP` update rule.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::names::{is_dns1123_label, is_dns1123_subdomain, is_ip, INVALID_IP};
use super::object::validate_labels;
use super::pod::{one_of, port_num_errors, port_num_or_name_errors, PORT_PROTOCOLS};
use super::{get, get_arr, get_i64, get_str, invalid_each, IMMUTABLE};
use crate::field::{FieldError, Path};

const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const NODE_PORT_RANGE: std::ops::RangeInclusive<i64> = 30000..=32767;

pub(crate) fn validate_service(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    let ty = get_str(spec, "type");
    let cluster_ip = get_str(spec, "clusterIP");
    let headless = cluster_ip == "None";
    let ports = get_arr(spec, "ports");
    let ports_path = path.child("ports");

    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.push(FieldError::required(&ports_path, ""));
    }
    errs.extend(one_of(spec, "type", SERVICE_TYPES, &path.child("type")));

    let mut names = BTreeSet::new();
    let mut seen_ports = BTreeSet::new();
    let mut seen_node_ports = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = ports_path.index(i);
        let name = get_str(port, "name");
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else if !name.is_empty() {
            errs.extend(invalid_each(&p.child("name"), name, is_dns1123_label(name)));
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(p.child("name"), get(port, "name")));
            }
        }
        let number = get_i64(port, "port").unwrap_or(0);
        errs.extend(port_num_errors(number, &p.child("port")));
        errs.extend(one_of(port, "protocol", PORT_PROTOCOLS, &p.child("protocol")));
        errs.extend(port_num_or_name_errors(get(port, "targetPort"), &p.child("targetPort")));

        let protocol = get_str(port, "protocol").to_string();
        if !seen_ports.insert((protocol.clone(), number)) {
            errs.push(FieldError::duplicate(&p, &json!({"port": number, "protocol": protocol})));
        }
        let node_port = get_i64(port, "nodePort").unwrap_or(0);
        if node_port != 0 {
            if ty == "ClusterIP" || ty == "ExternalName" {
                errs.push(FieldError::forbidden(p.child("nodePort"), format!("may not be used when `type` is '{ty}'")));
            } else if !NODE_PORT_RANGE.contains(&node_port) {
                errs.push(FieldError::invalid(
                    p.child("nodePort"),
                    &Value::from(node_port),
                    "provided port is not in the valid range. The range of valid ports is 30000-32767",
                ));
            }
            if !seen_node_ports.insert((protocol, node_port)) {
                errs.push(FieldError::duplicate(p.child("nodePort"), &Value::from(node_port)));
            }
        }
    }

    if ty == "ExternalName" {
        if !cluster_ip.is_empty() {
            errs.push(FieldError::forbidden(path.child("clusterIP"), "may not be set for ExternalName services"));
        }
        let cname = get_str(spec, "externalName");
        let cname = cname.strip_suffix('.').unwrap_or(cname);
        if cname.is_empty() {
            errs.push(FieldError::required(path.child("externalName"), ""));
        } else {
            errs.extend(invalid_each(&path.child("externalName"), cname, is_dns1123_subdomain(cname)));
        }
    } else if !cluster_ip.is_empty() && !headless && !is_ip(cluster_ip) {
        errs.push(FieldError::invalid(path.child("clusterIP"), get(spec, "clusterIP"), INVALID_IP));
    }
    for (i, ip) in get_arr(spec, "externalIPs").iter().enumerate() {
        if !ip.as_str().is_some_and(is_ip) {
            errs.push(FieldError::invalid(path.child("externalIPs").index(i), ip, INVALID_IP));
        }
    }

    errs.extend(validate_labels(get(spec, "selector"), &path.child("selector")));
    errs.extend(one_of(spec, "sessionAffinity", &["ClientIP", "None"], &path.child("sessionAffinity")));

    let externally_accessible =
        ty == "NodePort" || ty == "LoadBalancer" || (ty == "ClusterIP" && !get_arr(spec, "externalIPs").is_empty());
    let etp = get_str(spec, "externalTrafficPolicy");
    if externally_accessible {
        errs.extend(one_of(spec, "externalTrafficPolicy", &["Cluster", "Local"], &path.child("externalTrafficPolicy")));
    } else if !etp.is_empty() {
        errs.push(FieldError::invalid(
            path.child("externalTrafficPolicy"),
            get(spec, "externalTrafficPolicy"),
            "may only be set for externally-accessible services",
        ));
    }
    if !get_str(spec, "internalTrafficPolicy").is_empty() || ty != "ExternalName" {
        errs.extend(one_of(spec, "internalTrafficPolicy", &["Cluster", "Local"], &path.child("internalTrafficPolicy")));
    }

    if let Some(old) = old {
        let old_spec = get(old, "spec");
        let old_ip = get_str(old_spec, "clusterIP");
        let changing_external_name = ty == "ExternalName" || get_str(old_spec, "type") == "ExternalName";
        if !changing_external_name && !old_ip.is_empty() && !cluster_ip.is_empty() && old_ip != cluster_ip {
            errs.push(FieldError::invalid(path.child("clusterIP"), get(spec, "clusterIP"), IMMUTABLE));
        }
    }
    errs
}
