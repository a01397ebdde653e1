//! Service cluster IPs and node ports. Each allocation is a key of its own
//! (`/registry/serviceips/<ip>`, `/registry/servicenodeports/<port>`),
//! created in the same transaction as the Service with a "must not exist"
//! compare and deleted with it, so two Services can never hold the same IP
//! or port, on any master, without a separate allocator process.

use std::net::Ipv4Addr;

use rand::Rng;
use serde_json::{json, Value};
use skiff_api::field::{FieldError, Path};

/// The service CIDR, 10.96.0.0/12, as Kubernetes defaults it.
const CIDR_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
const CIDR_BITS: u32 = 12;
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The first usable address, reserved for the `kubernetes` Service.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<i64> = 30000..=32767;

pub fn ip_key(ip: &str) -> String {
    format!("/registry/serviceips/{ip}")
}

pub fn port_key(port: i64) -> String {
    format!("/registry/servicenodeports/{port}")
}

fn in_cidr(ip: Ipv4Addr) -> bool {
    let mask = !0u32 << (32 - CIDR_BITS);
    let n = u32::from(ip);
    n & mask == CIDR_BASE && n != CIDR_BASE && n != CIDR_BASE | !mask
}

fn needs_cluster_ip(svc: &Value) -> bool {
    svc["spec"]["type"].as_str() != Some("ExternalName")
}

fn needs_node_ports(svc: &Value) -> bool {
    matches!(svc["spec"]["type"].as_str(), Some("NodePort") | Some("LoadBalancer"))
}

/// The allocation keys `svc` holds.
pub fn held(svc: &Value) -> Vec<String> {
    let mut keys = Vec::new();
    if let Some(ip) = svc["spec"]["clusterIP"].as_str() {
        if ip.parse::<Ipv4Addr>().is_ok() {
            keys.push(ip_key(ip));
        }
    }
    for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
        if let Some(p) = port["nodePort"].as_i64().filter(|p| *p > 0) {
            keys.push(port_key(p));
        }
    }
    keys
}

/// Checks user-chosen addresses and fills in the missing ones at random.
/// Returns the field of every user-chosen allocation, so a conflict on it
/// can be reported against that field instead of retried.
pub fn assign(svc: &mut Value, old: Option<&Value>) -> Result<Vec<(String, String)>, FieldError> {
    let mut chosen = Vec::new();
    let mut rng = rand::thread_rng();
    if needs_cluster_ip(svc) {
        let spec = &mut svc["spec"];
        match spec["clusterIP"].as_str() {
            None | Some("") => {
                let ip = old.and_then(|o| o["spec"]["clusterIP"].as_str()).filter(|s| !s.is_empty());
                let ip = ip.map(str::to_string).unwrap_or_else(|| {
                    let size = 1u32 << (32 - CIDR_BITS);
                    // Skip the network address and the kubernetes Service's.
                    Ipv4Addr::from(CIDR_BASE + rng.gen_range(2..size - 1)).to_string()
                });
                spec["clusterIP"] = json!(ip);
            }
            Some("None") => {}
            Some(ip) => {
                let parsed: Option<Ipv4Addr> = ip.parse().ok();
                if !parsed.is_some_and(in_cidr) {
                    return Err(FieldError::invalid(
                        "spec.clusterIP",
                        &json!(ip),
                        format!("provided IP is not in the valid range. The range of valid IPs is {SERVICE_CIDR}"),
                    ));
                }
                if old.and_then(|o| o["spec"]["clusterIP"].as_str()) != Some(ip) {
                    chosen.push((ip_key(ip), "spec.clusterIP".to_string()));
                }
            }
        }
        if let Some(ip) = spec["clusterIP"].as_str().map(str::to_string) {
            spec["clusterIPs"] = json!([ip]);
            if ip != "None" {
                spec["ipFamilies"] = json!(["IPv4"]);
                spec["ipFamilyPolicy"] = json!("SingleStack");
            }
        }
    }
    if needs_node_ports(svc) {
        // `allocateLoadBalancerNodePorts: false`: a LoadBalancer whose
        // balancer sends traffic to the pods directly keeps only the
        // NodePorts its user chose.
        let allocate = svc["spec"]["allocateLoadBalancerNodePorts"].as_bool() != Some(false)
            || svc["spec"]["type"].as_str() != Some("LoadBalancer");
        let old_ports: Vec<i64> = old.map(held_ports).unwrap_or_default();
        let mut used: Vec<i64> = Vec::new();
        let ports = svc["spec"]["ports"].as_array_mut().map(std::mem::take).unwrap_or_default();
        let mut out = Vec::with_capacity(ports.len());
        for (i, mut port) in ports.into_iter().enumerate() {
            match port["nodePort"].as_i64().filter(|p| *p > 0) {
                Some(p) => {
                    if !NODE_PORT_RANGE.contains(&p) {
                        return Err(FieldError::invalid(
                            Path::new("spec").child("ports").index(i).child("nodePort"),
                            &json!(p),
                            "provided port is not in the valid range. The range of valid ports is 30000-32767",
                        ));
                    }
                    if !old_ports.contains(&p) {
                        chosen.push((port_key(p), format!("spec.ports[{i}].nodePort")));
                    }
                    used.push(p);
                }
                None if !allocate => {}
                None => {
                    let p = loop {
                        let p = rng.gen_range(NODE_PORT_RANGE);
                        if !used.contains(&p) {
                            break p;
                        }
                    };
                    used.push(p);
                    port["nodePort"] = json!(p);
                }
            }
            out.push(port);
        }
        svc["spec"]["ports"] = Value::Array(out);
    } else if let Some(ports) = svc["spec"]["ports"].as_array_mut() {
        for port in ports {
            if let Some(m) = port.as_object_mut() {
                m.remove("nodePort");
            }
        }
    }
    Ok(chosen)
}

fn held_ports(svc: &Value) -> Vec<i64> {
    svc["spec"]["ports"].as_array().into_iter().flatten().filter_map(|p| p["nodePort"].as_i64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_ip_service_gets_an_address_in_the_range() {
        let mut svc = json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}});
        assert!(assign(&mut svc, None).unwrap().is_empty());
        let ip: Ipv4Addr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(in_cidr(ip));
        assert_ne!(ip.to_string(), KUBERNETES_SERVICE_IP);
        assert_eq!(held(&svc), vec![ip_key(&ip.to_string())]);
    }

    #[test]
    fn a_node_port_service_gets_distinct_ports_and_keeps_chosen_ones() {
        let mut svc = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}, {"port": 81}]}});
        let chosen = assign(&mut svc, None).unwrap();
        assert_eq!(chosen, vec![(port_key(30080), "spec.ports[0].nodePort".to_string())]);
        let second = svc["spec"]["ports"][1]["nodePort"].as_i64().unwrap();
        assert!(NODE_PORT_RANGE.contains(&second) && second != 30080);
    }

    #[test]
    fn a_load_balancer_without_node_port_allocation_keeps_only_the_chosen_ones() {
        let mut svc = json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "ports": [{"port": 80}, {"port": 81, "nodePort": 30081}]}});
        let chosen = assign(&mut svc, None).unwrap();
        assert_eq!(chosen, vec![(port_key(30081), "spec.ports[1].nodePort".to_string())]);
        assert!(svc["spec"]["ports"][0].get("nodePort").is_none(), "{svc}");
        assert_eq!(held(&svc), vec![ip_key(svc["spec"]["clusterIP"].as_str().unwrap()), port_key(30081)]);
        // The default allocates, as for a NodePort Service.
        let mut svc =
            json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": true, "ports": [{"port": 80}]}});
        assign(&mut svc, None).unwrap();
        assert!(NODE_PORT_RANGE.contains(&svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap()));
    }

    #[test]
    fn addresses_outside_the_range_are_refused_with_their_field() {
        let mut svc = json!({"spec": {"clusterIP": "192.168.0.1"}});
        assert_eq!(assign(&mut svc, None).unwrap_err().field, "spec.clusterIP");
        let mut svc = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}});
        assert_eq!(assign(&mut svc, None).unwrap_err().field, "spec.ports[0].nodePort");
    }

    #[test]
    fn headless_and_external_name_services_hold_nothing() {
        let mut svc = json!({"spec": {"clusterIP": "None", "ports": [{"port": 80}]}});
        assign(&mut svc, None).unwrap();
        assert!(held(&svc).is_empty());
        let mut svc = json!({"spec": {"type": "ExternalName", "externalName": "example.com"}});
        assign(&mut svc, None).unwrap();
        assert!(held(&svc).is_empty());
    }
}
