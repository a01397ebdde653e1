//! The iptables rules for a set of [`ServicePort`]s, as kube-proxy's
//! iptables mode builds them, and the `iptables-restore` input that takes
//! the kernel from one rule set to the next. Pure: no iptables runs here.
//!
//! Every rule is written exactly as `iptables-save` prints it back (the
//! match order, `--set-xmark` for `--or-mark`, probabilities as the kernel
//! stores them), so what the kernel holds can be compared with what is
//! wanted, chain by chain: a full sync writes only what differs.
//!
//! Chains, in the `nat` table (`<t>` is the node's tag, `<h>` a hash):
//! - `SKIFF-SVCS-<t>`: one rule per cluster IP and port, to the service
//!   port's chain, and per external IP (`spec.externalIPs`, a
//!   LoadBalancer's ingress IPs) and port, to its external chain; last,
//!   traffic to one of the host's own addresses goes on to
//!   `SKIFF-NODEPORTS-<t>`.
//! - `SKIFF-SVC-<t>-<h>`: the service port's endpoints, one chosen at
//!   random (rule i matches with probability 1/(n-i)), or the one a client
//!   had within the affinity timeout (`-m recent`). `SKIFF-SVL-<t>-<h>`
//!   holds only this node's endpoints, for the `Local` traffic policies.
//! - `SKIFF-EXT-<t>-<h>`: NodePort and external IP traffic: marked for masquerade and to
//!   all endpoints (`externalTrafficPolicy: Cluster`), or to this node's
//!   endpoints with the client's address kept (`Local`).
//! - `SKIFF-SEP-<t>-<h>`: one endpoint: its DNAT, and the masquerade mark
//!   for hairpin traffic (a pod reaching itself through its Service).
//! - `SKIFF-MARK-MASQ` and `SKIFF-POSTROUTING` (shared by every agent on
//!   the host, written identically by each): the mark, and the masquerade
//!   of marked packets on their way out.
//!
//! In the `filter` table, `SKIFF-SVCS-<t>` rejects new connections to a
//! service port with no endpoints at all, as kube-proxy does, so clients
//! fail at once instead of timing out.
//!
//! Every chain of a node carries its tag because several agents may share
//! one host (the tests run two): each programs its own chains, and its
//! pods' traffic is sent to them by the bridge it arrives on.
//!
//! Established connections keep their endpoint through any rewrite: NAT
//! is decided on a connection's first packet and kept in conntrack.

use std::collections::BTreeMap;
use std::fmt::Write;

use sha2::{Digest, Sha256};

use super::model::{Endpoint, ServicePort};
use crate::cni::BRIDGE_PREFIX;

/// Every Skiff chain's name starts with this.
pub const PREFIX: &str = "SKIFF-";
/// The shared chain marking packets for masquerade.
pub const MARK_MASQ: &str = "SKIFF-MARK-MASQ";
/// The shared chain masquerading marked packets, jumped to from POSTROUTING.
pub const POSTROUTING: &str = "SKIFF-POSTROUTING";
/// The mark bit, kube-proxy's.
pub const MASQ_MARK: &str = "0x4000";
/// The shared `filter` chain dropping what `route_localnet` would let in:
/// packets from elsewhere addressed to 127.0.0.0/8 (kubelet's and
/// kube-proxy's `KUBE-FIREWALL` rule, CVE-2020-8558).
pub const FIREWALL: &str = "SKIFF-FIREWALL";

/// Chain name -> its rules (each without the leading `-A <chain>`).
pub type Chains = BTreeMap<String, Vec<String>>;

/// One node's rules in both tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// The `nat` table's chains.
    pub nat: Chains,
    /// The `filter` table's chains.
    pub filter: Chains,
}

/// What the rules depend on besides the services.
#[derive(Debug, Clone)]
pub struct Context {
    /// The node's tag in its chains' names ([`tag`]).
    pub tag: String,
    /// The whole pod range: traffic to a cluster IP from elsewhere is masqueraded.
    pub cluster_cidr: String,
}

/// Six hex digits of the node name's SHA-256.
pub fn tag(node: &str) -> String {
    hash(node, 6)
}

/// The first `digits` (even) hex digits of `text`'s SHA-256, upper case.
fn hash(text: &str, digits: usize) -> String {
    let mut out = String::with_capacity(digits);
    for byte in &Sha256::digest(text.as_bytes())[..digits / 2] {
        let _ = write!(out, "{byte:02X}");
    }
    out
}

/// The node's top chain in both tables.
pub fn services_chain(tag: &str) -> String {
    format!("{PREFIX}SVCS-{tag}")
}

/// The node's NodePort chain.
pub fn nodeports_chain(tag: &str) -> String {
    format!("{PREFIX}NODEPORTS-{tag}")
}

/// Whether `chain` is one of the node's own (not the shared ones).
pub fn owned_by(chain: &str, tag: &str) -> bool {
    chain.strip_prefix(PREFIX).and_then(|rest| rest.split_once('-')).is_some_and(|(_, rest)| rest.starts_with(tag))
}

fn chain(kind: &str, tag: &str, key: &str) -> String {
    // 6 + 4 + 6 + 1 + 10 = 27 characters; iptables allows 28.
    format!("{PREFIX}{kind}-{tag}-{}", hash(key, 10))
}

fn endpoint_chain(tag: &str, port: &ServicePort, endpoint: &Endpoint) -> String {
    chain("SEP", tag, &format!("{}/{}/{}:{}", port.key, port.protocol, endpoint.ip, endpoint.port))
}

/// The rules for `ports` on the node of `context`.
pub fn render(ports: &[ServicePort], context: &Context) -> Rules {
    let parts: Vec<PortRules> = ports.iter().map(|port| render_port(port, context)).collect();
    assemble(&parts, context)
}

/// One service port's share of the rules: its rules in the node's shared
/// chains and its own chains. A sync renders only the ports that changed
/// since the last and reuses the others' ([`assemble`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// In the services chain (`nat`).
    services: Vec<String>,
    /// In the NodePorts chain.
    nodeports: Vec<String>,
    /// In the services chain of the `filter` table.
    rejects: Vec<String>,
    /// Its own `nat` chains.
    chains: Vec<(String, Vec<String>)>,
}

/// The whole rule set from each port's share, in the order given.
pub fn assemble<'a>(parts: impl IntoIterator<Item = &'a PortRules>, context: &Context) -> Rules {
    let tag = context.tag.as_str();
    let services = services_chain(tag);
    let nodeports = nodeports_chain(tag);
    let mut rules = Rules::default();
    let nat = &mut rules.nat;
    nat.insert(MARK_MASQ.to_string(), vec![format!("-j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}")]);
    nat.insert(
        POSTROUTING.to_string(),
        vec![
            format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-j MARK --set-xmark {MASQ_MARK}/0x0"),
            "-m comment --comment \"skiff service traffic requiring SNAT\" -j MASQUERADE --random-fully".to_string(),
        ],
    );
    let (mut top, mut by_node_port, mut rejects) = (Vec::new(), Vec::new(), Vec::new());
    for part in parts {
        top.extend_from_slice(&part.services);
        by_node_port.extend_from_slice(&part.nodeports);
        rejects.extend_from_slice(&part.rejects);
        for (name, chain) in &part.chains {
            nat.insert(name.clone(), chain.clone());
        }
    }
    // Every local address, 127.0.0.1 included (with `route_localnet`, set
    // by the proxy), as kube-proxy's default `localhostNodePorts`.
    top.push(format!(
        "-m comment --comment \"skiff service nodeports; must be last\" -m addrtype --dst-type LOCAL -j {nodeports}"
    ));
    nat.insert(services.clone(), top);
    nat.insert(nodeports, by_node_port);
    rules.filter.insert(services, rejects);
    rules.filter.insert(
        FIREWALL.to_string(),
        vec!["! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP".to_string()],
    );
    rules
}

/// `port`'s share of the rules on the node of `context`.
pub fn render_port(port: &ServicePort, context: &Context) -> PortRules {
    let tag = context.tag.as_str();
    let mut out = PortRules::default();
    let key = &port.key;
    let proto = port.protocol;
    let all = chain("SVC", tag, &format!("{key}/{proto}"));
    let local = chain("SVL", tag, &format!("{key}/{proto}"));
    let external = chain("EXT", tag, &format!("{key}/{proto}"));
    let cluster_chain = if port.internal_local { &local } else { &all };
    let addresses = port.cluster_ips.iter().chain(&port.external_ips);
    if port.endpoints.is_empty() {
        for ip in addresses {
            out.rejects.push(format!(
                "-d {ip}/32 -p {proto} -m comment --comment \"{key} has no endpoints\" -m {proto} --dport {} -j REJECT --reject-with icmp-port-unreachable",
                port.port
            ));
        }
        if let Some(node_port) = port.node_port {
            out.rejects.push(format!(
                "-p {proto} -m addrtype --dst-type LOCAL -m comment --comment \"{key} has no endpoints\" -m {proto} --dport {node_port} -j REJECT --reject-with icmp-port-unreachable"
            ));
        }
        return out;
    }
    for ip in &port.cluster_ips {
        out.services.push(format!(
            "-d {ip}/32 -p {proto} -m comment --comment \"{key} cluster IP\" -m {proto} --dport {} -j {cluster_chain}",
            port.port
        ));
    }
    for ip in &port.external_ips {
        out.services.push(format!(
            "-d {ip}/32 -p {proto} -m comment --comment \"{key} external IP\" -m {proto} --dport {} -j {external}",
            port.port
        ));
    }

    let mut all_rules = Vec::new();
    for ip in &port.cluster_ips {
        // From outside the pod range (the host itself): masqueraded,
        // so the reply comes back through this node.
        all_rules.push(format!(
            "! -s {} -d {ip}/32 -p {proto} -m comment --comment \"{key} cluster IP\" -m {proto} --dport {} -j {MARK_MASQ}",
            context.cluster_cidr, port.port
        ));
    }
    let mut local_rules = all_rules.clone();
    spread(&mut all_rules, tag, port, &port.endpoints);
    out.chains.push((all.clone(), all_rules));
    if port.internal_local || port.external_local {
        spread(&mut local_rules, tag, port, &port.local_endpoints());
        out.chains.push((local.clone(), local_rules));
    }

    if let Some(node_port) = port.node_port {
        out.nodeports.push(format!(
            "-p {proto} -m comment --comment \"{key} node port\" -m {proto} --dport {node_port} -j {external}"
        ));
    }
    if port.node_port.is_some() || !port.external_ips.is_empty() {
        let external_rules = if port.external_local {
            vec![
                // Pods and the host itself reach every endpoint, as kube-proxy lets them.
                format!("-s {} -j {all}", context.cluster_cidr),
                format!("-m addrtype --src-type LOCAL -j {MARK_MASQ}"),
                format!("-m addrtype --src-type LOCAL -j {all}"),
                format!("-j {local}"),
            ]
        } else {
            vec![format!("-j {MARK_MASQ}"), format!("-j {all}")]
        };
        out.chains.push((external, external_rules));
    }

    for endpoint in &port.endpoints {
        let sep = endpoint_chain(tag, port, endpoint);
        let recent = match port.affinity_seconds {
            Some(_) => format!(" -m recent --set --name {sep} --mask 255.255.255.255 --rsource"),
            None => String::new(),
        };
        let rules = vec![
            format!("-s {}/32 -m comment --comment \"{key}\" -j {MARK_MASQ}", endpoint.ip),
            format!(
                "-p {proto} -m comment --comment \"{key}\"{recent} -m {proto} -j DNAT --to-destination {}:{}",
                endpoint.ip, endpoint.port
            ),
        ];
        out.chains.push((sep, rules));
    }
    out
}

/// Appends to `rules` the choice among `endpoints`: the one a client had
/// (session affinity), else one at random with equal chances.
fn spread(rules: &mut Vec<String>, tag: &str, port: &ServicePort, endpoints: &[Endpoint]) {
    let key = &port.key;
    if let Some(seconds) = port.affinity_seconds {
        for endpoint in endpoints {
            let sep = endpoint_chain(tag, port, endpoint);
            rules.push(format!(
                "-m comment --comment \"{key} -> {}:{}\" -m recent --rcheck --seconds {seconds} --reap --name {sep} --mask 255.255.255.255 --rsource -j {sep}",
                endpoint.ip, endpoint.port
            ));
        }
    }
    let n = endpoints.len();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let sep = endpoint_chain(tag, port, endpoint);
        let mut rule = format!("-m comment --comment \"{key} -> {}:{}\"", endpoint.ip, endpoint.port);
        if i + 1 < n {
            let _ = write!(rule, " -m statistic --mode random --probability {}", probability(n - i));
        }
        let _ = write!(rule, " -j {sep}");
        rules.push(rule);
    }
}

/// The chance of `-m statistic --mode random` for picking one of `n`,
/// as `iptables-save` prints it back: the kernel keeps it as a fraction
/// of 2^31 and the extension prints that with 11 decimals.
fn probability(n: usize) -> String {
    const SCALE: f64 = 2_147_483_648.0;
    let stored = (SCALE / n as f64).round();
    format!("{:.11}", stored / SCALE)
}

/// A rule in a built-in chain sending traffic to one of Skiff's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// `nat` or `filter`.
    pub table: &'static str,
    /// The built-in chain.
    pub chain: &'static str,
    /// The rule, as `iptables-save` prints it after `-A <chain> `.
    pub rule: String,
}

/// The jumps of the node tagged `tag`: its pods' traffic (arriving on
/// `bridge`), traffic from elsewhere, and the host's own; and the shared
/// masquerade.
pub fn jumps(tag: &str, bridge: Option<&str>) -> Vec<Jump> {
    let services = services_chain(tag);
    let to_services = |table, chain, matches: &str| Jump {
        table,
        chain,
        rule: format!("{matches}-m comment --comment \"skiff services {tag}\" -j {services}"),
    };
    let mut out = Vec::new();
    match bridge {
        Some(bridge) => {
            out.push(to_services("nat", "PREROUTING", &format!("-i {bridge} ")));
            // Other nodes' agents on this host take their own bridges' traffic.
            out.push(to_services("nat", "PREROUTING", &format!("! -i {BRIDGE_PREFIX}+ ")));
        }
        None => out.push(to_services("nat", "PREROUTING", "")),
    }
    out.push(to_services("nat", "OUTPUT", ""));
    for chain in ["INPUT", "FORWARD", "OUTPUT"] {
        out.push(to_services("filter", chain, "-m conntrack --ctstate NEW "));
    }
    out.push(Jump {
        table: "nat",
        chain: "POSTROUTING",
        rule: format!("-m comment --comment \"skiff postrouting\" -j {POSTROUTING}"),
    });
    for chain in ["INPUT", "OUTPUT"] {
        out.push(Jump {
            table: "filter",
            chain,
            rule: format!("-m comment --comment \"skiff firewall\" -j {FIREWALL}"),
        });
    }
    out
}

/// What `iptables-save` printed of interest: Skiff's chains with their
/// rules, and the rules of the built-in chains (where the jumps are).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    /// Every Skiff chain, by table.
    pub ours: Rules,
    /// `(table, chain)` -> the rules of each chain that is not Skiff's.
    pub others: BTreeMap<(String, String), Vec<String>>,
}

impl Saved {
    /// Whether the kernel holds `jump`.
    pub fn has(&self, jump: &Jump) -> bool {
        self.others.get(&(jump.table.to_string(), jump.chain.to_string())).is_some_and(|r| r.contains(&jump.rule))
    }

    /// Only the Skiff chains `keep` says are wanted.
    pub fn ours_only(&self, keep: impl Fn(&str) -> bool) -> Rules {
        let pick =
            |chains: &Chains| chains.iter().filter(|(n, _)| keep(n)).map(|(n, r)| (n.clone(), r.clone())).collect();
        Rules { nat: pick(&self.ours.nat), filter: pick(&self.ours.filter) }
    }
}

/// Reads the `nat` and `filter` tables of an `iptables-save`.
pub fn parse_save(saved: &str) -> Saved {
    let mut out = Saved::default();
    let mut table: Option<&str> = None;
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(name.trim()).filter(|t| matches!(*t, "nat" | "filter"));
            continue;
        }
        let Some(table) = table else { continue };
        let ours = if table == "nat" { &mut out.ours.nat } else { &mut out.ours.filter };
        if let Some(declared) = line.strip_prefix(':') {
            let name = declared.split_whitespace().next().unwrap_or_default();
            if name.starts_with(PREFIX) {
                ours.entry(name.to_string()).or_default();
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, rule) = rule.split_once(' ').unwrap_or((rule, ""));
            if chain.starts_with(PREFIX) {
                ours.entry(chain.to_string()).or_default().push(rule.to_string());
            } else {
                out.others.entry((table.to_string(), chain.to_string())).or_default().push(rule.to_string());
            }
        }
    }
    out
}

/// The `iptables-restore --noflush` input that takes the kernel from `old`
/// (what was last written, or what a full sync read back) to `new`, adding
/// the `missing` jumps first in their chains (as kube-proxy does): only the
/// chains that changed are declared (declaring flushes) and rewritten, and
/// the chains gone are flushed and deleted. `None` when nothing changed.
pub fn restore_input(old: &Rules, new: &Rules, missing: &[&Jump]) -> Option<String> {
    let mut out = String::new();
    let tables = [("nat", &old.nat, &new.nat), ("filter", &old.filter, &new.filter)];
    for (table, old, new) in tables {
        let changed: Vec<(&String, &Vec<String>)> =
            new.iter().filter(|(name, rules)| old.get(*name) != Some(rules)).collect();
        let gone: Vec<&String> = old.keys().filter(|name| !new.contains_key(*name)).collect();
        let inserts: Vec<&&Jump> = missing.iter().filter(|j| j.table == table).collect();
        if changed.is_empty() && gone.is_empty() && inserts.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{table}");
        for name in changed.iter().map(|(name, _)| *name).chain(gone.iter().copied()) {
            let _ = writeln!(out, ":{name} - [0:0]");
        }
        for (name, rules) in &changed {
            for rule in *rules {
                let _ = writeln!(out, "-A {name} {rule}");
            }
        }
        for jump in inserts {
            let _ = writeln!(out, "-I {} 1 {}", jump.chain, jump.rule);
        }
        for name in &gone {
            let _ = writeln!(out, "-X {name}");
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn context() -> Context {
        Context { tag: "ABC123".into(), cluster_cidr: "10.244.0.0/16".into() }
    }

    fn endpoint(last: u8, local: bool) -> Endpoint {
        Endpoint { ip: Ipv4Addr::new(10, 244, 1, last), port: 8080, local }
    }

    fn web(endpoints: Vec<Endpoint>) -> ServicePort {
        ServicePort {
            key: "default/web:http".into(),
            protocol: "tcp",
            cluster_ips: vec![Ipv4Addr::new(10, 96, 0, 20)],
            external_ips: vec![],
            port: 80,
            node_port: None,
            affinity_seconds: None,
            external_local: false,
            internal_local: false,
            endpoints,
        }
    }

    fn svc(port: &ServicePort) -> String {
        chain("SVC", "ABC123", &format!("{}/{}", port.key, port.protocol))
    }

    fn sep(port: &ServicePort, e: &Endpoint) -> String {
        endpoint_chain("ABC123", port, e)
    }

    #[test]
    fn a_cluster_ip_spreads_over_its_endpoints_with_equal_chances_and_dnats_to_each() {
        let port = web(vec![endpoint(5, true), endpoint(6, false), endpoint(7, false)]);
        let rules = render(std::slice::from_ref(&port), &context());
        let services = &rules.nat["SKIFF-SVCS-ABC123"];
        assert_eq!(
            services,
            &vec![
                format!("-d 10.96.0.20/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j {}", svc(&port)),
                "-m comment --comment \"skiff service nodeports; must be last\" -m addrtype --dst-type LOCAL -j SKIFF-NODEPORTS-ABC123".to_string(),
            ]
        );
        let (a, b, c) =
            (sep(&port, &endpoint(5, true)), sep(&port, &endpoint(6, false)), sep(&port, &endpoint(7, false)));
        assert_eq!(
            rules.nat[&svc(&port)],
            vec![
                format!("! -s 10.244.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j SKIFF-MARK-MASQ"),
                format!("-m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.33333333349 -j {a}"),
                format!("-m comment --comment \"default/web:http -> 10.244.1.6:8080\" -m statistic --mode random --probability 0.50000000000 -j {b}"),
                format!("-m comment --comment \"default/web:http -> 10.244.1.7:8080\" -j {c}"),
            ]
        );
        assert_eq!(
            rules.nat[&a],
            vec![
                "-s 10.244.1.5/32 -m comment --comment \"default/web:http\" -j SKIFF-MARK-MASQ".to_string(),
                "-p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination 10.244.1.5:8080"
                    .to_string(),
            ],
            "hairpin traffic is masqueraded"
        );
        assert!(rules.filter["SKIFF-SVCS-ABC123"].is_empty());
        assert!(rules.nat.keys().all(|name| name.len() <= 28), "{:?}", rules.nat.keys());
    }

    #[test]
    fn session_affinity_checks_the_clients_last_endpoint_before_choosing() {
        let mut port = web(vec![endpoint(5, true), endpoint(6, false)]);
        port.affinity_seconds = Some(600);
        let rules = render(std::slice::from_ref(&port), &context());
        let a = sep(&port, &endpoint(5, true));
        let chain = &rules.nat[&svc(&port)];
        assert_eq!(chain.len(), 1 + 2 + 2);
        assert_eq!(
            chain[1],
            format!("-m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m recent --rcheck --seconds 600 --reap --name {a} --mask 255.255.255.255 --rsource -j {a}")
        );
        assert!(rules.nat[&a][1].contains(&format!("-m recent --set --name {a} --mask 255.255.255.255 --rsource")));
    }

    #[test]
    fn node_ports_masquerade_for_cluster_policy_and_keep_the_source_for_local() {
        let mut port = web(vec![endpoint(5, true), endpoint(6, false)]);
        port.node_port = Some(30080);
        let rules = render(std::slice::from_ref(&port), &context());
        let external = chain("EXT", "ABC123", "default/web:http/tcp");
        assert_eq!(
            rules.nat["SKIFF-NODEPORTS-ABC123"],
            vec![format!(
                "-p tcp -m comment --comment \"default/web:http node port\" -m tcp --dport 30080 -j {external}"
            )]
        );
        assert_eq!(rules.nat[&external], vec!["-j SKIFF-MARK-MASQ".to_string(), format!("-j {}", svc(&port))]);

        port.external_local = true;
        let rules = render(std::slice::from_ref(&port), &context());
        let local = chain("SVL", "ABC123", "default/web:http/tcp");
        assert_eq!(rules.nat[&external].last(), Some(&format!("-j {local}")));
        let only_local = &rules.nat[&local];
        assert_eq!(only_local.len(), 2, "the masquerade rule and the one local endpoint: {only_local:?}");
        assert!(only_local[1].ends_with(&format!("-j {}", sep(&port, &endpoint(5, true)))));
    }

    #[test]
    fn external_ips_are_served_as_the_node_port_is() {
        let mut port = web(vec![endpoint(5, true), endpoint(6, false)]);
        port.external_ips = vec![Ipv4Addr::new(192, 0, 2, 7)];
        let rules = render(std::slice::from_ref(&port), &context());
        let external = chain("EXT", "ABC123", "default/web:http/tcp");
        assert_eq!(
            rules.nat["SKIFF-SVCS-ABC123"][1],
            format!("-d 192.0.2.7/32 -p tcp -m comment --comment \"default/web:http external IP\" -m tcp --dport 80 -j {external}")
        );
        // Masqueraded, so a reply from an endpoint on another node comes back through this one.
        assert_eq!(rules.nat[&external], vec!["-j SKIFF-MARK-MASQ".to_string(), format!("-j {}", svc(&port))]);
        assert!(rules.nat["SKIFF-NODEPORTS-ABC123"].is_empty(), "no NodePort");
    }

    #[test]
    fn internal_local_sends_the_cluster_ip_to_this_nodes_endpoints_only() {
        let mut port = web(vec![endpoint(5, true), endpoint(6, false)]);
        port.internal_local = true;
        let rules = render(std::slice::from_ref(&port), &context());
        let local = chain("SVL", "ABC123", "default/web:http/tcp");
        assert!(rules.nat["SKIFF-SVCS-ABC123"][0].ends_with(&format!("-j {local}")));
        assert_eq!(rules.nat[&local].iter().filter(|r| r.contains("-> 10.244.1.")).count(), 1);
    }

    #[test]
    fn a_port_without_endpoints_is_rejected_in_the_filter_table_and_has_no_nat_chain() {
        let mut port = web(vec![]);
        port.node_port = Some(30080);
        let rules = render(std::slice::from_ref(&port), &context());
        let filter = &rules.filter["SKIFF-SVCS-ABC123"];
        assert_eq!(filter.len(), 2);
        assert!(
            filter[0].starts_with("-d 10.96.0.20/32 -p tcp")
                && filter[0].ends_with("--dport 80 -j REJECT --reject-with icmp-port-unreachable")
        );
        assert!(
            filter[1].contains("--dst-type LOCAL")
                && filter[1].ends_with("--dport 30080 -j REJECT --reject-with icmp-port-unreachable")
        );
        assert_eq!(rules.nat.len(), 4, "only the fixed chains: {:?}", rules.nat.keys());
    }

    /// `rules` as `iptables-save` prints them, with `extra` lines in `nat`.
    fn saved(rules: &Rules, extra: &str) -> String {
        let mut out = String::new();
        for (table, chains) in [("nat", &rules.nat), ("filter", &rules.filter)] {
            let _ = writeln!(out, "*{table}\n:PREROUTING ACCEPT [0:0]");
            for name in chains.keys() {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for (name, rules) in chains {
                for rule in rules {
                    let _ = writeln!(out, "-A {name} {rule}");
                }
            }
            if table == "nat" {
                out.push_str(extra);
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    #[test]
    fn a_full_sync_writes_only_what_the_kernel_lacks_and_removes_what_a_previous_run_left() {
        let port = web(vec![endpoint(5, true)]);
        let wanted = render(std::slice::from_ref(&port), &context());
        let jumps = jumps("ABC123", None);

        // A restart with the rules and jumps in place: nothing to write.
        let mut extra = String::new();
        for jump in jumps.iter().filter(|j| j.table == "nat") {
            let _ = writeln!(extra, "-A {} {}", jump.chain, jump.rule);
        }
        let kernel = parse_save(&saved(&wanted, &extra));
        assert_eq!(kernel.ours, wanted, "the save reads back as what was rendered");
        let missing: Vec<&Jump> = jumps.iter().filter(|j| !kernel.has(j)).collect();
        assert_eq!(missing.len(), 5, "the filter table's jumps: {missing:?}");
        let input = restore_input(&kernel.ours, &wanted, &missing).expect("jumps to add");
        assert_eq!(input.lines().filter(|l| l.starts_with("-I ")).count(), 5);
        assert!(!input.contains("*nat"), "nothing for nat: {input}");
        assert!(!input.lines().any(|l| l.starts_with(':')), "no chain rewritten: {input}");

        // A previous run's chain, and one of ours changed behind our back.
        let mut drifted = wanted.clone();
        drifted.nat.insert("SKIFF-SVC-ABC123-0000000000".into(), vec!["-j RETURN".into()]);
        drifted.nat.get_mut(MARK_MASQ).expect("the mark chain").clear();
        let kernel = parse_save(&saved(&drifted, ""));
        let input = restore_input(&kernel.ours, &wanted, &[]).expect("drift to repair");
        assert_eq!(
            input,
            format!(
                "*nat\n:{MARK_MASQ} - [0:0]\n:SKIFF-SVC-ABC123-0000000000 - [0:0]\n-A {MARK_MASQ} -j MARK --set-xmark 0x4000/0x4000\n-X SKIFF-SVC-ABC123-0000000000\nCOMMIT\n"
            )
        );
    }

    #[test]
    fn the_save_is_read_by_table_and_by_whose_chain_it_is() {
        let saved = parse_save(
            "# Generated by iptables-save\n*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j SKIFF-X\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:SKIFF-SVCS-ABC123 - [0:0]\n:SKIFF-SEP-ABC123-0123456789 - [0:0]\n-A PREROUTING -m comment --comment \"skiff services ABC123\" -j SKIFF-SVCS-ABC123\n-A SKIFF-SVCS-ABC123 -d 10.96.0.1/32 -j RETURN\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n",
        );
        assert_eq!(saved.ours.nat["SKIFF-SVCS-ABC123"], vec!["-d 10.96.0.1/32 -j RETURN".to_string()]);
        assert!(saved.ours.nat["SKIFF-SEP-ABC123-0123456789"].is_empty(), "declared, empty");
        assert!(saved.ours.filter.is_empty(), "mangle is not read");
        assert!(saved.has(&jumps("ABC123", None)[0]));
        assert!(!saved.has(&jumps("DEF456", None)[0]));
    }

    #[test]
    fn a_nodes_pods_reach_its_chains_by_its_bridge_and_everything_else_by_the_first_agent() {
        let jumps = jumps("ABC123", Some("skiff0a1b2c3d"));
        let prerouting: Vec<_> = jumps.iter().filter(|j| j.chain == "PREROUTING").map(|j| j.rule.as_str()).collect();
        assert_eq!(
            prerouting,
            [
                "-i skiff0a1b2c3d -m comment --comment \"skiff services ABC123\" -j SKIFF-SVCS-ABC123",
                "! -i skiff+ -m comment --comment \"skiff services ABC123\" -j SKIFF-SVCS-ABC123",
            ]
        );
        assert!(jumps
            .iter()
            .all(|j| ["-j SKIFF-SVCS-ABC123", POSTROUTING, FIREWALL].iter().any(|t| j.rule.ends_with(t))));
        assert_eq!(jumps.iter().filter(|j| j.table == "filter").count(), 5);
    }

    #[test]
    fn node_ports_answer_on_localhost_behind_the_localnet_firewall() {
        let mut port = web(vec![endpoint(5, true)]);
        port.node_port = Some(30080);
        let rules = render(std::slice::from_ref(&port), &context());
        let last = rules.nat["SKIFF-SVCS-ABC123"].last().expect("the NodePort rule");
        assert!(!last.contains("127.0.0.0/8"), "127.0.0.1 is a local address like any other: {last}");
        // What route_localnet lets in from elsewhere, untranslated, is dropped.
        assert_eq!(
            rules.filter[FIREWALL],
            vec!["! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP".to_string()]
        );
        let firewall: Vec<&str> =
            jumps("ABC123", None).iter().filter(|j| j.rule.ends_with(FIREWALL)).map(|j| j.chain).collect();
        assert_eq!(firewall, ["INPUT", "OUTPUT"]);
        // The masquerade gives the translated packet a source its endpoint can answer.
        let external = chain("EXT", "ABC123", "default/web:http/tcp");
        assert_eq!(rules.nat[&external][0], "-j SKIFF-MARK-MASQ");
    }

    #[test]
    fn probabilities_are_printed_as_the_kernel_keeps_them() {
        // What `iptables-save` printed for rules written with 1/2, 1/3 and 1/10.
        assert_eq!(probability(2), "0.50000000000");
        assert_eq!(probability(3), "0.33333333349");
        assert_eq!(probability(10), "0.10000000009");
    }

    #[test]
    fn an_endpoint_change_rewrites_only_the_chains_it_touches() {
        let before = render(&[web(vec![endpoint(5, true), endpoint(6, false)])], &context());
        let after = render(&[web(vec![endpoint(5, true)])], &context());
        let input = restore_input(&before, &after, &[]).expect("a change");
        let port = web(vec![]);
        let gone = sep(&port, &endpoint(6, false));
        assert_eq!(
            input,
            format!(
                "*nat\n:{svc} - [0:0]\n:{gone} - [0:0]\n-A {svc} ! -s 10.244.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j SKIFF-MARK-MASQ\n-A {svc} -m comment --comment \"default/web:http -> 10.244.1.5:8080\" -j {kept}\n-X {gone}\nCOMMIT\n",
                svc = svc(&port),
                kept = sep(&port, &endpoint(5, true)),
            )
        );
        assert_eq!(restore_input(&after, &after, &[]), None, "nothing to write");
    }

    #[test]
    fn chains_are_told_apart_by_their_nodes_tag() {
        assert!(owned_by("SKIFF-SVC-ABC123-0123456789", "ABC123"));
        assert!(owned_by("SKIFF-SVCS-ABC123", "ABC123"));
        assert!(!owned_by("SKIFF-SVCS-DEF456", "ABC123"));
        assert!(!owned_by(MARK_MASQ, "ABC123"));
        assert!(!owned_by(POSTROUTING, "ABC123"));
        assert_ne!(tag("node-0"), tag("node-1"));
    }
}
