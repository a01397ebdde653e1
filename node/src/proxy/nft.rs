//! kube-proxy's nftables mode: the same Services as [`super::rules`]
//! programs, in one nftables table per node, where a Service is found by
//! one lookup in a verdict map instead of a walk down a chain of rules.
//!
//! Why it exists: with iptables, every change goes through
//! `iptables-restore --noflush`, whose cost grows with the whole table
//! (on iptables-nft 1.8.9 it is quadratic: seconds for 1,000 Services
//! with 10 endpoints each, `bench/README.md`). An `nft -f` transaction
//! costs about what it changes: an endpoint joining a Service rewrites
//! that Service's chain, whatever else the table holds.
//!
//! The table `ip skiff-<tag>` (`<tag>` as in [`super::rules::tag`]):
//! - base chains `nat-prerouting` (the node's pods' bridge, and traffic
//!   from elsewhere), `nat-output` (the host's own) -> `services`;
//!   `nat-postrouting` -> `masquerading`; `filter-input`, `filter-forward`,
//!   `filter-output` -> `endpoints-check` for new connections, and in
//!   `filter-input` and `filter-output` first kubelet's drop of untranslated
//!   packets to 127.0.0.0/8 from elsewhere (as the iptables mode's
//!   `SKIFF-FIREWALL`);
//! - `services`: `ip daddr . meta l4proto . th dport vmap @service-ips`,
//!   then, for the host's own addresses, `vmap @service-nodeports`;
//! - `service-<ns>/<name>/<proto>/p<port>`: the masquerade mark for
//!   traffic from outside the pod range, then the translation itself:
//!   `dnat ip addr . port to numgen random mod n map { 0 : <ip> . <port>, … }`;
//!   `local-…` the same over this node's endpoints only (the `Local`
//!   traffic policies); `external-…` for NodePort and external IP
//!   (`spec.externalIPs`, a LoadBalancer's ingress) traffic;
//! - with `sessionAffinity: ClientIP`, the service port's chain first
//!   sends a client found in an endpoint's `affinity-<seconds>-<endpoint>`
//!   set (dynamic, entries kept for the timeout) to that endpoint's
//!   chain, and picks new clients' endpoint with `numgen … vmap`; the
//!   endpoint's chain `endpoint-<service port>__<ip>/<port>` adds the
//!   client to its set and translates;
//! - `masquerading` (from `nat-postrouting`): hairpin traffic (a pod
//!   translated to itself: `ip saddr . ip daddr @hairpin-endpoints`, this
//!   node's endpoints) and packets carrying the masquerade mark;
//! - `endpoints-check` rejects new connections to a service port with no
//!   endpoints (`@no-endpoint-services`, `@no-endpoint-nodeports`).
//!
//! This differs from kube-proxy's nftables mode in one way, on purpose:
//! kube-proxy gives every endpoint a chain, and at 10,000 endpoints those
//! chains are what the kernel's table validation and `nft`'s chain cache
//! spend their time on, in every transaction (a one-rule change took 70 ms
//! with them, 20 ms without; a full write 1 s against 0.3 s). Translating
//! through a map keeps one chain per service port.
//!
//! Several agents on one host each own their table; the masquerade mark
//! bit (0x4000, kube-proxy's) is shared, and whichever table masquerades
//! a packet clears it. Established connections keep their endpoint
//! through any rewrite: NAT is decided on a connection's first packet
//! and kept in conntrack.
//!
//! Pure, but for [`Kernel`]: the rules are a value ([`render`]) and a
//! sync is the `nft -f` script between two of them ([`transaction`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::model::{Endpoint, ServicePort};
use super::rules::{Context, MASQ_MARK};
use super::{run_command, ProxyError};
use crate::cni::BRIDGE_PREFIX;

/// Every Skiff table's name starts with this.
pub const TABLE_PREFIX: &str = "skiff-";

/// The map from cluster IP (and external IP), protocol and port to the service port's chain.
pub const SERVICE_IPS: &str = "service-ips";
/// The map from protocol and NodePort to the service port's external chain.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// The addresses of service ports with no endpoints, to reject.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// The NodePorts of service ports with no endpoints, to reject.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// `ip . ip` for each of this node's endpoints: a connection translated
/// to its own source is hairpin traffic, masqueraded.
pub const HAIRPIN: &str = "hairpin-endpoints";

/// The maps and sets with elements: name, kind, type.
const MAPS: [(&str, &str, &str); 5] = [
    (SERVICE_IPS, "map", "ipv4_addr . inet_proto . inet_service : verdict"),
    (SERVICE_NODEPORTS, "map", "inet_proto . inet_service : verdict"),
    (NO_ENDPOINT_SERVICES, "map", "ipv4_addr . inet_proto . inet_service : verdict"),
    (NO_ENDPOINT_NODEPORTS, "map", "inet_proto . inet_service : verdict"),
    (HAIRPIN, "set", "ipv4_addr . ipv4_addr"),
];

/// The base chains: name, and what hooks them in.
const BASE_CHAINS: [(&str, &str); 6] = [
    ("nat-prerouting", "type nat hook prerouting priority dstnat; policy accept;"),
    ("nat-output", "type nat hook output priority -100; policy accept;"),
    ("nat-postrouting", "type nat hook postrouting priority srcnat; policy accept;"),
    ("filter-input", "type filter hook input priority -110; policy accept;"),
    ("filter-forward", "type filter hook forward priority -110; policy accept;"),
    ("filter-output", "type filter hook output priority -110; policy accept;"),
];

const SERVICES: &str = "services";
const MASQUERADING: &str = "masquerading";
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const ENDPOINTS_CHECK: &str = "endpoints-check";
const REJECT: &str = "reject-chain";

/// The node's table.
pub fn table(tag: &str) -> String {
    format!("{TABLE_PREFIX}{tag}")
}

/// One node's rules: the table's chains (base chains included), map
/// elements and affinity sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftRules {
    /// Chain -> its rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Map (or set with elements) -> element key -> verdict (empty for a set's).
    pub maps: BTreeMap<&'static str, BTreeMap<String, String>>,
    /// Affinity set -> its timeout in seconds.
    pub sets: BTreeMap<String, i32>,
}

impl NftRules {
    /// The number of rules and map elements.
    pub fn size(&self) -> usize {
        self.chains.values().map(Vec::len).sum::<usize>() + self.maps.values().map(BTreeMap::len).sum::<usize>()
    }
}

/// The rules for `ports` on the node of `context`, whose pods' traffic
/// arrives on `bridge`.
pub fn render(ports: &[ServicePort], context: &Context, bridge: Option<&str>) -> NftRules {
    let mut out = NftRules::default();
    for (name, _, _) in MAPS {
        out.maps.insert(name, BTreeMap::new());
    }
    let tag = &context.tag;
    let to_services = format!("jump {SERVICES}");
    let prerouting = match bridge {
        Some(bridge) => vec![
            format!("iifname \"{bridge}\" {to_services}"),
            // Other nodes' agents on this host take their own bridges' traffic.
            format!("iifname != \"{BRIDGE_PREFIX}*\" {to_services}"),
        ],
        None => vec![to_services.clone()],
    };
    let comment = format!("comment \"skiff services {tag}\"");
    let check = format!("ct state new jump {ENDPOINTS_CHECK}");
    // kubelet's KUBE-FIREWALL rule (CVE-2020-8558): with `route_localnet`
    // on, which this mode does not need but an iptables-mode agent of this
    // host may have left set, the kernel would take packets to 127.0.0.0/8
    // from elsewhere. Only what a NAT rule translated may pass.
    let localnet =
        "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status ! dnat drop";
    let fixed: [(&str, Vec<String>); 11] = [
        ("nat-prerouting", prerouting.into_iter().map(|r| format!("{r} {comment}")).collect()),
        ("nat-output", vec![format!("{to_services} {comment}")]),
        ("nat-postrouting", vec![format!("jump {MASQUERADING}")]),
        ("filter-input", vec![localnet.to_string(), check.clone()]),
        ("filter-forward", vec![check.clone()]),
        ("filter-output", vec![localnet.to_string(), check]),
        (
            SERVICES,
            vec![
                format!("ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
                format!(
                    "ip daddr != 127.0.0.0/8 fib daddr type local meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
                ),
            ],
        ),
        (
            MASQUERADING,
            vec![
                format!("ct status dnat ip saddr . ip daddr @{HAIRPIN} masquerade fully-random"),
                format!("meta mark & {MASQ_MARK} == 0 return"),
                format!("meta mark set meta mark ^ {MASQ_MARK}"),
                "masquerade fully-random".to_string(),
            ],
        ),
        (MARK_FOR_MASQUERADE, vec![format!("meta mark set meta mark | {MASQ_MARK}")]),
        (
            ENDPOINTS_CHECK,
            vec![
                format!("ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
                format!(
                    "ip daddr != 127.0.0.0/8 fib daddr type local meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
                ),
            ],
        ),
        (REJECT, vec!["reject".to_string()]),
    ];
    for (name, rules) in fixed {
        out.chains.insert(name.to_string(), rules);
    }
    for port in ports {
        render_port(port, context, &mut out);
    }
    out
}

/// `<ns>/<name>/<proto>/p<port>`: unique per service port (a Service's
/// ports differ in port or protocol), and a valid nft identifier.
fn port_id(port: &ServicePort) -> String {
    let service = port.key.split(':').next().unwrap_or_default();
    format!("{service}/{}/p{}", port.protocol, port.port)
}

fn endpoint_id(port: &ServicePort, endpoint: &Endpoint) -> String {
    format!("{}__{}/{}", port_id(port), endpoint.ip, endpoint.port)
}

fn affinity_set(port: &ServicePort, endpoint: &Endpoint, seconds: i32) -> String {
    // The timeout is in the name: a set's timeout cannot change in place.
    format!("affinity-{seconds}-{}", endpoint_id(port, endpoint))
}

fn render_port(port: &ServicePort, context: &Context, out: &mut NftRules) {
    let id = port_id(port);
    let proto = port.protocol;
    let all = format!("service-{id}");
    let local = format!("local-{id}");
    let external = format!("external-{id}");
    let cluster_chain = if port.internal_local { &local } else { &all };
    // No loopback external IP (a LoadBalancer on nodes at 127.0.0.1): as
    // for NodePorts, this mode leaves `route_localnet` off.
    let external_ips: Vec<_> = port.external_ips.iter().filter(|ip| !ip.is_loopback()).collect();
    let addresses: Vec<_> = port.cluster_ips.iter().chain(external_ips.iter().copied()).collect();
    if port.endpoints.is_empty() {
        let map = out.maps.entry(NO_ENDPOINT_SERVICES).or_default();
        for ip in &addresses {
            map.insert(format!("{ip} . {proto} . {}", port.port), format!("goto {REJECT}"));
        }
        if let Some(node_port) = port.node_port {
            let map = out.maps.entry(NO_ENDPOINT_NODEPORTS).or_default();
            map.insert(format!("{proto} . {node_port}"), format!("goto {REJECT}"));
        }
        return;
    }
    let map = out.maps.entry(SERVICE_IPS).or_default();
    for ip in &port.cluster_ips {
        map.insert(format!("{ip} . {proto} . {}", port.port), format!("goto {cluster_chain}"));
    }
    for ip in &external_ips {
        map.insert(format!("{ip} . {proto} . {}", port.port), format!("goto {external}"));
    }

    // From outside the pod range (the host itself): masqueraded, so the
    // reply comes back through this node.
    let masquerade: Vec<String> = port
        .cluster_ips
        .iter()
        .map(|ip| {
            format!(
                "ip daddr {ip} {proto} dport {} ip saddr != {} jump {MARK_FOR_MASQUERADE}",
                port.port, context.cluster_cidr
            )
        })
        .collect();
    let mut all_rules = masquerade.clone();
    spread(&mut all_rules, port, &port.endpoints);
    out.chains.insert(all.clone(), all_rules);
    if port.internal_local || port.external_local {
        let mut local_rules = masquerade;
        spread(&mut local_rules, port, &port.local_endpoints());
        out.chains.insert(local.clone(), local_rules);
    }

    if let Some(node_port) = port.node_port {
        out.maps
            .entry(SERVICE_NODEPORTS)
            .or_default()
            .insert(format!("{proto} . {node_port}"), format!("goto {external}"));
    }
    if port.node_port.is_some() || !external_ips.is_empty() {
        let rules = if port.external_local {
            vec![
                // Pods and the host itself reach every endpoint, as kube-proxy lets them.
                format!("ip saddr {} goto {all}", context.cluster_cidr),
                format!("fib saddr type local jump {MARK_FOR_MASQUERADE}"),
                format!("fib saddr type local goto {all}"),
                format!("goto {local}"),
            ]
        } else {
            vec![format!("jump {MARK_FOR_MASQUERADE}"), format!("goto {all}")]
        };
        out.chains.insert(external, rules);
    }

    let hairpin = out.maps.entry(HAIRPIN).or_default();
    for endpoint in port.endpoints.iter().filter(|e| e.local) {
        hairpin.insert(format!("{0} . {0}", endpoint.ip), String::new());
    }
    // Only session affinity needs a chain per endpoint (to remember the
    // client); otherwise the service port's chain translates itself.
    if let Some(seconds) = port.affinity_seconds {
        for endpoint in &port.endpoints {
            let set = affinity_set(port, endpoint, seconds);
            let rules = vec![format!("update @{set} {{ ip saddr }}"), dnat(proto, &[*endpoint])];
            out.sets.insert(set, seconds);
            out.chains.insert(format!("endpoint-{}", endpoint_id(port, endpoint)), rules);
        }
    }
}

/// The translation to one of `endpoints` (at least one), chosen at random.
fn dnat(proto: &str, endpoints: &[Endpoint]) -> String {
    if let [endpoint] = endpoints {
        return format!("meta l4proto {proto} dnat to {}:{}", endpoint.ip, endpoint.port);
    }
    let mut rule = format!("meta l4proto {proto} dnat ip addr . port to numgen random mod {} map {{ ", endpoints.len());
    for (i, endpoint) in endpoints.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        let _ = write!(rule, "{separator}{i} : {} . {}", endpoint.ip, endpoint.port);
    }
    rule.push_str(" }");
    rule
}

/// Appends to `rules` the choice among `endpoints`: the one a client had
/// (session affinity), else one at random with equal chances.
fn spread(rules: &mut Vec<String>, port: &ServicePort, endpoints: &[Endpoint]) {
    if endpoints.is_empty() {
        return;
    }
    let Some(seconds) = port.affinity_seconds else {
        rules.push(dnat(port.protocol, endpoints));
        return;
    };
    for endpoint in endpoints {
        let set = affinity_set(port, endpoint, seconds);
        rules.push(format!("ip saddr @{set} goto endpoint-{}", endpoint_id(port, endpoint)));
    }
    let mut rule = format!("numgen random mod {} vmap {{ ", endpoints.len());
    for (i, endpoint) in endpoints.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        let _ = write!(rule, "{separator}{i} : goto endpoint-{}", endpoint_id(port, endpoint));
    }
    rule.push_str(" }");
    rules.push(rule);
}

/// What a table held when it was listed: its chains and sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    /// Chain names.
    pub chains: BTreeSet<String>,
    /// Set names.
    pub sets: BTreeSet<String>,
}

/// The tables in `nft list chains ip` / `nft list sets ip` output, with
/// the chains or sets declared in each.
pub fn parse_listing(text: &str, kind: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("table ip ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            out.entry(name.clone()).or_default();
            table = Some(name);
        } else if let Some(rest) = line.strip_prefix(kind).and_then(|r| r.strip_prefix(' ')) {
            if let Some(table) = &table {
                let name = rest.trim_end_matches('{').trim().trim_matches('"');
                out.entry(table.clone()).or_default().insert(name.to_string());
            }
        }
    }
    out
}

/// The `nft -f` script that takes the table from `old` to `new`: with
/// `old` known (what was last written), only what changed; with `old`
/// unknown, every chain is written again (flushed first if `listed` has
/// it, declared if not), every map flushed and refilled, and whatever
/// else `listed` finds in the table deleted. `None` when
/// nothing changed. One transaction: the kernel applies all of it or none.
pub fn transaction(table: &str, old: Option<&NftRules>, new: &NftRules, listed: &Listed) -> Option<String> {
    let mut out = String::new();
    let empty = NftRules::default();
    let full = old.is_none();
    let old = old.unwrap_or(&empty);
    let base: BTreeMap<&str, &str> = BASE_CHAINS.into_iter().collect();

    if full {
        let _ = writeln!(out, "add table ip {table}");
        for (name, kind, type_) in MAPS {
            let _ = writeln!(out, "add {kind} ip {table} {name} {{ type {type_}; }}");
            let _ = writeln!(out, "flush {kind} ip {table} {name}");
        }
    }
    // New objects first: rules and elements name them.
    for (name, seconds) in &new.sets {
        if full || !old.sets.contains_key(name) {
            let _ = writeln!(
                out,
                "add set ip {table} {name} {{ type ipv4_addr; flags dynamic,timeout; timeout {seconds}s; }}"
            );
        }
    }
    let changed: Vec<(&String, &Vec<String>)> =
        new.chains.iter().filter(|(name, rules)| full || old.chains.get(*name) != Some(*rules)).collect();
    let gone: Vec<&String> = if full {
        listed.chains.iter().filter(|name| !new.chains.contains_key(*name)).collect()
    } else {
        old.chains.keys().filter(|name| !new.chains.contains_key(*name)).collect()
    };
    let gone_sets: Vec<&String> = if full {
        let fixed = |name: &str| MAPS.iter().any(|(fixed, _, _)| *fixed == name);
        listed.sets.iter().filter(|name| !new.sets.contains_key(*name) && !fixed(name)).collect()
    } else {
        old.sets.keys().filter(|name| !new.sets.contains_key(*name)).collect()
    };
    // Present: flushed below (a full sync knows what is present from
    // `listed`, and declares only what is not: declaring 11,000 chains
    // that exist costs the kernel as much as writing them).
    let present = |name: &String| if full { listed.chains.contains(name) } else { old.chains.contains_key(name) };
    for (name, _) in &changed {
        if !present(name) {
            match base.get(name.as_str()) {
                Some(hook) => {
                    let _ = writeln!(out, "add chain ip {table} {name} {{ {hook} }}");
                }
                None => {
                    let _ = writeln!(out, "add chain ip {table} {name}");
                }
            }
        }
    }
    // Elements that go or change, before the chains they name go.
    if !full {
        for (map, elements) in &new.maps {
            let before = old.maps.get(map);
            let removed: Vec<&String> = before
                .into_iter()
                .flatten()
                .filter(|(key, verdict)| elements.get(*key) != Some(*verdict))
                .map(|(key, _)| key)
                .collect();
            if !removed.is_empty() {
                let keys: Vec<&str> = removed.iter().map(|k| k.as_str()).collect();
                let _ = writeln!(out, "delete element ip {table} {map} {{ {} }}", keys.join(", "));
            }
        }
    }
    for name in changed.iter().map(|(name, _)| *name).chain(gone.iter().copied()) {
        if present(name) {
            let _ = writeln!(out, "flush chain ip {table} {name}");
        }
    }
    for (name, rules) in &changed {
        for rule in *rules {
            let _ = writeln!(out, "add rule ip {table} {name} {rule}");
        }
    }
    for (map, elements) in &new.maps {
        let before = old.maps.get(map);
        let added: Vec<String> = elements
            .iter()
            .filter(|(key, verdict)| full || before.and_then(|b| b.get(*key)) != Some(*verdict))
            .map(|(key, verdict)| if verdict.is_empty() { key.clone() } else { format!("{key} : {verdict}") })
            .collect();
        if !added.is_empty() {
            let _ = writeln!(out, "add element ip {table} {map} {{ {} }}", added.join(", "));
        }
    }
    for name in gone {
        let _ = writeln!(out, "delete chain ip {table} {name}");
    }
    for name in gone_sets {
        let _ = writeln!(out, "delete set ip {table} {name}");
    }
    (!out.is_empty()).then_some(out)
}

/// The `nft` commands a sync runs.
pub struct Kernel;

impl Kernel {
    /// What `table` holds now (empty if it does not exist).
    pub async fn list(table: &str) -> Result<Listed, ProxyError> {
        let chains = run_command("nft", &["list", "chains", "ip"], None).await?;
        let sets = run_command("nft", &["list", "sets", "ip"], None).await?;
        Ok(Listed {
            chains: parse_listing(&chains, "chain").remove(table).unwrap_or_default(),
            sets: parse_listing(&sets, "set").remove(table).unwrap_or_default(),
        })
    }

    /// Runs `script` as one transaction.
    pub async fn apply(script: &str) -> Result<(), ProxyError> {
        run_command("nft", &["-f", "-"], Some(script)).await.map(|_| ())
    }

    /// Whether `table` still hooks the node's traffic: its prerouting
    /// chain exists and jumps to the services. Cheap: lists one chain.
    pub async fn has_rules(table: &str) -> bool {
        run_command("nft", &["list", "chain", "ip", table, "nat-prerouting"], None)
            .await
            .is_ok_and(|listed| listed.contains(&format!("jump {SERVICES}")))
    }
}

/// Deletes the table of the node tagged `tag`, or with `None` every
/// Skiff table; the number of chains they held. A host without `nft`
/// has none.
pub async fn cleanup(tag: Option<&str>) -> Result<usize, ProxyError> {
    let listed = match run_command("nft", &["list", "chains", "ip"], None).await {
        Ok(listed) => listed,
        Err(ProxyError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let doomed: Vec<(String, usize)> = parse_listing(&listed, "chain")
        .into_iter()
        .filter(|(name, _)| match tag {
            Some(tag) => *name == table(tag),
            None => name.starts_with(TABLE_PREFIX),
        })
        .map(|(name, chains)| (name, chains.len()))
        .collect();
    if doomed.is_empty() {
        return Ok(0);
    }
    let script: String = doomed.iter().map(|(name, _)| format!("delete table ip {name}\n")).collect();
    Kernel::apply(&script).await?;
    Ok(doomed.iter().map(|(_, chains)| chains).sum())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn context() -> Context {
        Context { tag: "ABC123".into(), cluster_cidr: "10.244.0.0/16".into() }
    }

    fn port(key: &str, endpoints: &[(u8, bool)]) -> ServicePort {
        ServicePort {
            key: key.into(),
            protocol: "tcp",
            cluster_ips: vec![Ipv4Addr::new(10, 96, 0, 10)],
            external_ips: vec![],
            port: 80,
            node_port: None,
            affinity_seconds: None,
            external_local: false,
            internal_local: false,
            endpoints: endpoints
                .iter()
                .map(|&(last, local)| Endpoint { ip: Ipv4Addr::new(10, 244, 1, last), port: 8080, local })
                .collect(),
        }
    }

    #[test]
    fn a_service_port_is_a_map_element_and_a_chain_translating_to_a_random_endpoint() {
        let rules = render(&[port("default/web:http", &[(2, true), (3, false)])], &context(), Some("skiffbr-x"));
        assert_eq!(
            rules.maps[SERVICE_IPS],
            BTreeMap::from([("10.96.0.10 . tcp . 80".to_string(), "goto service-default/web/tcp/p80".to_string())])
        );
        assert_eq!(
            rules.chains["service-default/web/tcp/p80"],
            [
                "ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
                "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map \
                 { 0 : 10.244.1.2 . 8080, 1 : 10.244.1.3 . 8080 }",
            ]
        );
        assert!(!rules.chains.keys().any(|c| c.starts_with("endpoint-")), "no chain per endpoint");
        // Hairpin: only this node's endpoint can reach itself here.
        assert_eq!(rules.maps[HAIRPIN], BTreeMap::from([("10.244.1.2 . 10.244.1.2".to_string(), String::new())]));
        assert_eq!(
            rules.chains["nat-prerouting"],
            [
                "iifname \"skiffbr-x\" jump services comment \"skiff services ABC123\"",
                &format!("iifname != \"{BRIDGE_PREFIX}*\" jump services comment \"skiff services ABC123\""),
            ]
        );
        assert!(rules.maps[NO_ENDPOINT_SERVICES].is_empty());
        assert!(rules.sets.is_empty());
    }

    #[test]
    fn untranslated_packets_to_the_loopback_range_from_elsewhere_are_dropped_on_input_and_output() {
        let rules = render(&[], &context(), None);
        let drop =
            "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status ! dnat drop";
        for chain in ["filter-input", "filter-output"] {
            assert_eq!(rules.chains[chain], [drop, "ct state new jump endpoints-check"], "{chain}");
        }
        assert_eq!(rules.chains["filter-forward"], ["ct state new jump endpoints-check"]);
    }

    #[test]
    fn no_endpoints_is_a_reject_and_affinity_is_a_set_per_endpoint() {
        let mut empty = port("default/none", &[]);
        empty.node_port = Some(30080);
        let mut sticky = port("default/sticky", &[(4, false)]);
        sticky.cluster_ips = vec![Ipv4Addr::new(10, 96, 0, 11)];
        sticky.affinity_seconds = Some(60);
        let rules = render(&[empty, sticky], &context(), None);
        assert_eq!(rules.maps[NO_ENDPOINT_SERVICES]["10.96.0.10 . tcp . 80"], "goto reject-chain");
        assert_eq!(rules.maps[NO_ENDPOINT_NODEPORTS]["tcp . 30080"], "goto reject-chain");
        assert!(!rules.chains.contains_key("service-default/none/tcp/p80"));
        let set = "affinity-60-default/sticky/tcp/p80__10.244.1.4/8080";
        assert_eq!(rules.sets, BTreeMap::from([(set.to_string(), 60)]));
        assert_eq!(
            rules.chains["service-default/sticky/tcp/p80"][1..],
            [
                format!("ip saddr @{set} goto endpoint-default/sticky/tcp/p80__10.244.1.4/8080"),
                "numgen random mod 1 vmap { 0 : goto endpoint-default/sticky/tcp/p80__10.244.1.4/8080 }".to_string(),
            ]
        );
        assert_eq!(
            rules.chains["endpoint-default/sticky/tcp/p80__10.244.1.4/8080"],
            [format!("update @{set} {{ ip saddr }}"), "meta l4proto tcp dnat to 10.244.1.4:8080".to_string()]
        );
        assert_eq!(rules.chains["nat-prerouting"], ["jump services comment \"skiff services ABC123\""]);
    }

    #[test]
    fn external_ips_go_to_the_external_chain_except_loopback_ones() {
        let mut p = port("default/web", &[(2, true)]);
        p.external_ips = vec![Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(192, 0, 2, 7)];
        let rules = render(&[p], &context(), None);
        assert_eq!(
            rules.maps[SERVICE_IPS],
            BTreeMap::from([
                ("10.96.0.10 . tcp . 80".to_string(), "goto service-default/web/tcp/p80".to_string()),
                ("192.0.2.7 . tcp . 80".to_string(), "goto external-default/web/tcp/p80".to_string()),
            ])
        );
        assert_eq!(
            rules.chains["external-default/web/tcp/p80"],
            ["jump mark-for-masquerade", "goto service-default/web/tcp/p80"]
        );
    }

    #[test]
    fn local_policies_get_their_own_chains_over_local_endpoints() {
        let mut p = port("default/web", &[(2, true), (3, false)]);
        p.node_port = Some(30001);
        p.external_local = true;
        p.internal_local = true;
        let rules = render(&[p], &context(), None);
        assert_eq!(rules.maps[SERVICE_IPS]["10.96.0.10 . tcp . 80"], "goto local-default/web/tcp/p80");
        assert_eq!(rules.maps[SERVICE_NODEPORTS]["tcp . 30001"], "goto external-default/web/tcp/p80");
        assert_eq!(rules.chains["local-default/web/tcp/p80"][1], "meta l4proto tcp dnat to 10.244.1.2:8080");
        assert_eq!(rules.chains["external-default/web/tcp/p80"].last().unwrap(), "goto local-default/web/tcp/p80");
    }

    #[test]
    fn an_incremental_transaction_touches_only_what_changed_and_deletes_after_unreferencing() {
        let before = render(&[port("default/web", &[(2, false), (3, true)])], &context(), None);
        let after = render(&[port("default/web", &[(2, false)])], &context(), None);
        let script = transaction("skiff-ABC123", Some(&before), &after, &Listed::default()).unwrap();
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            lines,
            [
                "delete element ip skiff-ABC123 hairpin-endpoints { 10.244.1.3 . 10.244.1.3 }",
                "flush chain ip skiff-ABC123 service-default/web/tcp/p80",
                "add rule ip skiff-ABC123 service-default/web/tcp/p80 ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
                "add rule ip skiff-ABC123 service-default/web/tcp/p80 meta l4proto tcp dnat to 10.244.1.2:8080",
            ]
        );
        // With affinity, an endpoint's chain and set go in the same
        // transaction, after what names them is rewritten.
        let sticky = |endpoints: &[(u8, bool)]| {
            let mut p = port("default/web", endpoints);
            p.affinity_seconds = Some(60);
            render(&[p], &context(), None)
        };
        let script = transaction(
            "skiff-ABC123",
            Some(&sticky(&[(2, false), (3, false)])),
            &sticky(&[(2, false)]),
            &Listed::default(),
        )
        .unwrap();
        let gone = "default/web/tcp/p80__10.244.1.3/8080";
        assert!(script.starts_with("flush chain ip skiff-ABC123 service-default/web/tcp/p80\n"), "{script}");
        assert!(
            script.ends_with(&format!(
                "delete chain ip skiff-ABC123 endpoint-{gone}\ndelete set ip skiff-ABC123 affinity-60-{gone}\n"
            )),
            "{script}"
        );
        assert_eq!(transaction("skiff-ABC123", Some(&after), &after, &Listed::default()), None);

        // The last endpoint goes: the element moves to the reject map.
        let none = render(&[port("default/web", &[])], &context(), None);
        let script = transaction("skiff-ABC123", Some(&after), &none, &Listed::default()).unwrap();
        assert!(
            script.starts_with("delete element ip skiff-ABC123 service-ips { 10.96.0.10 . tcp . 80 }\n"),
            "{script}"
        );
        assert!(script.contains(
            "add element ip skiff-ABC123 no-endpoint-services { 10.96.0.10 . tcp . 80 : goto reject-chain }"
        ));
        assert!(script.ends_with("delete chain ip skiff-ABC123 service-default/web/tcp/p80\n"), "{script}");
    }

    #[test]
    fn a_full_transaction_rewrites_everything_and_deletes_what_the_listing_has_extra() {
        let rules = render(&[port("default/web", &[(2, false)])], &context(), None);
        let listed = Listed {
            chains: ["services".to_string(), "service-default/old/tcp/p80".to_string()].into(),
            sets: ["affinity-60-old".to_string(), HAIRPIN.to_string()].into(),
        };
        let script = transaction("skiff-ABC123", None, &rules, &listed).unwrap();
        assert!(script.starts_with("add table ip skiff-ABC123\n"));
        assert!(script.contains(
            "add chain ip skiff-ABC123 nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }\n"
        ));
        assert!(script.contains("flush map ip skiff-ABC123 service-ips\n"));
        assert!(script.contains("flush chain ip skiff-ABC123 services\n"));
        assert!(!script.contains("add chain ip skiff-ABC123 services\n"), "present: flushed, not declared");
        assert!(!script.contains("flush chain ip skiff-ABC123 service-default/web/tcp/p80\n"), "absent: declared");
        assert!(script.contains("flush chain ip skiff-ABC123 service-default/old/tcp/p80\n"));
        assert!(script.ends_with(
            "delete chain ip skiff-ABC123 service-default/old/tcp/p80\ndelete set ip skiff-ABC123 affinity-60-old\n"
        ));
    }

    #[test]
    fn listings_are_read_per_table() {
        let text = "table ip filter {\n\tchain INPUT {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n\
                    table ip skiff-ABC123 {\n\tchain services {\n\t}\n\tchain endpoint-a/b/tcp/p80__10.0.0.1/80 {\n\t}\n}\n";
        let listed = parse_listing(text, "chain");
        assert_eq!(listed["filter"], BTreeSet::from(["INPUT".to_string()]));
        assert_eq!(
            listed["skiff-ABC123"],
            BTreeSet::from(["services".to_string(), "endpoint-a/b/tcp/p80__10.0.0.1/80".to_string()])
        );
    }
}
