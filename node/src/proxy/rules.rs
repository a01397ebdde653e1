//! The iptables rules for a set of [`ServicePort`]s, as kube-proxy's
//! iptables mode builds them, and the `iptables-restore` input that takes
//! the kernel from one rule set to the next. Pure: no iptables runs here.
//!
//! Chains, in the `nat` table (`<t>` is the node's tag, `<h>` a hash):
//! - `SKIFF-SVCS-<t>`: one rule per cluster IP (and external IP) and port,
//!   to the service port's chain; last, traffic to one of the host's own
//!   addresses goes on to `SKIFF-NODEPORTS-<t>`.
//! - `SKIFF-SVC-<t>-<h>`: the service port's endpoints, one chosen at
//!   random (rule i matches with probability 1/(n-i)), or the one a client
//!   had within the affinity timeout (`-m recent`). `SKIFF-SVL-<t>-<h>`
//!   holds only this node's endpoints, for the `Local` traffic policies.
//! - `SKIFF-EXT-<t>-<h>`: NodePort traffic: marked for masquerade and to
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use sha2::{Digest, Sha256};

use super::model::{Endpoint, ServicePort};

/// Every Skiff chain's name starts with this.
pub const PREFIX: &str = "SKIFF-";
/// The shared chain marking packets for masquerade.
pub const MARK_MASQ: &str = "SKIFF-MARK-MASQ";
/// The shared chain masquerading marked packets, jumped to from POSTROUTING.
pub const POSTROUTING: &str = "SKIFF-POSTROUTING";
/// The mark bit, kube-proxy's.
pub const MASQ_MARK: &str = "0x4000";

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
    hash(node)[..6].to_string()
}

fn hash(text: &str) -> String {
    format!("{:X}", Sha256::digest(text.as_bytes()))
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
    format!("{PREFIX}{kind}-{tag}-{}", &hash(key)[..10])
}

fn endpoint_chain(tag: &str, port: &ServicePort, endpoint: &Endpoint) -> String {
    chain("SEP", tag, &format!("{}/{}/{}:{}", port.key, port.protocol, endpoint.ip, endpoint.port))
}

/// The rules for `ports` on the node of `context`.
pub fn render(ports: &[ServicePort], context: &Context) -> Rules {
    let tag = context.tag.as_str();
    let services = services_chain(tag);
    let nodeports = nodeports_chain(tag);
    let mut rules = Rules::default();
    let nat = &mut rules.nat;
    nat.insert(MARK_MASQ.to_string(), vec![format!("-j MARK --or-mark {MASQ_MARK}")]);
    nat.insert(
        POSTROUTING.to_string(),
        vec![
            format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-j MARK --xor-mark {MASQ_MARK}"),
            "-m comment --comment \"skiff service traffic requiring SNAT\" -j MASQUERADE --random-fully".to_string(),
        ],
    );
    nat.insert(services.clone(), Vec::new());
    nat.insert(nodeports.clone(), Vec::new());
    rules.filter.insert(services.clone(), Vec::new());

    for port in ports {
        let key = &port.key;
        let proto = port.protocol;
        let all = chain("SVC", tag, &format!("{key}/{proto}"));
        let local = chain("SVL", tag, &format!("{key}/{proto}"));
        let cluster_chain = if port.internal_local { &local } else { &all };
        let addresses = port.cluster_ips.iter().chain(&port.external_ips);
        if port.endpoints.is_empty() {
            let filter = rules.filter.entry(services.clone()).or_default();
            for ip in addresses {
                filter.push(format!(
                    "-d {ip}/32 -p {proto} -m comment --comment \"{key} has no endpoints\" -m {proto} --dport {} -j REJECT",
                    port.port
                ));
            }
            if let Some(node_port) = port.node_port {
                filter.push(format!(
                    "-m addrtype --dst-type LOCAL -p {proto} -m comment --comment \"{key} has no endpoints\" -m {proto} --dport {node_port} -j REJECT"
                ));
            }
            continue;
        }
        let top = nat.entry(services.clone()).or_default();
        for ip in addresses {
            top.push(format!(
                "-d {ip}/32 -p {proto} -m comment --comment \"{key} cluster IP\" -m {proto} --dport {} -j {cluster_chain}",
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
        nat.insert(all.clone(), all_rules);
        if port.internal_local || port.external_local {
            spread(&mut local_rules, tag, port, &port.local_endpoints());
            nat.insert(local.clone(), local_rules);
        }

        if let Some(node_port) = port.node_port {
            let external = chain("EXT", tag, &format!("{key}/{proto}"));
            nat.entry(nodeports.clone()).or_default().push(format!(
                "-p {proto} -m comment --comment \"{key} node port\" -m {proto} --dport {node_port} -j {external}"
            ));
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
            nat.insert(external, external_rules);
        }

        for endpoint in &port.endpoints {
            let sep = endpoint_chain(tag, port, endpoint);
            let recent = match port.affinity_seconds {
                Some(_) => format!(" -m recent --name {sep} --set --mask 255.255.255.255 --rsource"),
                None => String::new(),
            };
            nat.insert(
                sep,
                vec![
                    format!("-s {}/32 -m comment --comment \"{key}\" -j {MARK_MASQ}", endpoint.ip),
                    format!(
                        "-p {proto} -m comment --comment \"{key}\"{recent} -m {proto} -j DNAT --to-destination {}:{}",
                        endpoint.ip, endpoint.port
                    ),
                ],
            );
        }
    }
    nat.entry(services).or_default().push(format!(
        "-m comment --comment \"skiff service nodeports; must be last\" ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j {nodeports}"
    ));
    rules
}

/// Appends to `rules` the choice among `endpoints`: the one a client had
/// (session affinity), else one at random with equal chances.
fn spread(rules: &mut Vec<String>, tag: &str, port: &ServicePort, endpoints: &[Endpoint]) {
    let key = &port.key;
    if let Some(seconds) = port.affinity_seconds {
        for endpoint in endpoints {
            let sep = endpoint_chain(tag, port, endpoint);
            rules.push(format!(
                "-m comment --comment \"{key} -> {}:{}\" -m recent --name {sep} --mask 255.255.255.255 --rsource --rcheck --seconds {seconds} --reap -j {sep}",
                endpoint.ip, endpoint.port
            ));
        }
    }
    let n = endpoints.len();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let sep = endpoint_chain(tag, port, endpoint);
        let mut rule = format!("-m comment --comment \"{key} -> {}:{}\"", endpoint.ip, endpoint.port);
        if i + 1 < n {
            let _ = write!(rule, " -m statistic --mode random --probability {:.10}", 1.0 / (n - i) as f64);
        }
        let _ = write!(rule, " -j {sep}");
        rules.push(rule);
    }
}

/// The `iptables-restore --noflush` input that takes the kernel from `old`
/// (what was last written; `None` at start) to `new`: only the chains that
/// changed are declared (declaring flushes) and rewritten, and the chains
/// gone (or `stale`, found in the kernel at start) are flushed and deleted.
/// `None` when nothing changed.
pub fn restore_input(old: Option<&Rules>, new: &Rules, stale: &Rules) -> Option<String> {
    let mut out = String::new();
    let empty = Chains::new();
    let tables = [
        ("nat", old.map(|o| &o.nat), &new.nat, &stale.nat),
        ("filter", old.map(|o| &o.filter), &new.filter, &stale.filter),
    ];
    for (table, old, new, stale) in tables {
        let old_chains = old.unwrap_or(&empty);
        let changed: Vec<(&String, &Vec<String>)> =
            new.iter().filter(|(name, rules)| old.is_none() || old_chains.get(*name) != Some(rules)).collect();
        let gone: BTreeSet<&String> =
            old_chains.keys().chain(stale.keys()).filter(|name| !new.contains_key(*name)).collect();
        if changed.is_empty() && gone.is_empty() {
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
        for name in &gone {
            let _ = writeln!(out, "-X {name}");
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
}

/// The Skiff chains `iptables-save` printed, by table, as [`Rules`] (names
/// only): what a restarted agent must account for.
pub fn chains_in_save(saved: &str) -> Rules {
    let mut rules = Rules::default();
    let mut table: Option<&mut Chains> = None;
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = match name.trim() {
                "nat" => Some(&mut rules.nat),
                "filter" => Some(&mut rules.filter),
                _ => None,
            };
        } else if let (Some(chains), Some(declared)) = (table.as_deref_mut(), line.strip_prefix(':')) {
            let name = declared.split_whitespace().next().unwrap_or_default();
            if name.starts_with(PREFIX) {
                chains.insert(name.to_string(), Vec::new());
            }
        }
    }
    rules
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
                "-m comment --comment \"skiff service nodeports; must be last\" ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j SKIFF-NODEPORTS-ABC123".to_string(),
            ]
        );
        let (a, b, c) =
            (sep(&port, &endpoint(5, true)), sep(&port, &endpoint(6, false)), sep(&port, &endpoint(7, false)));
        assert_eq!(
            rules.nat[&svc(&port)],
            vec![
                format!("! -s 10.244.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j SKIFF-MARK-MASQ"),
                format!("-m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.3333333333 -j {a}"),
                format!("-m comment --comment \"default/web:http -> 10.244.1.6:8080\" -m statistic --mode random --probability 0.5000000000 -j {b}"),
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
            format!("-m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m recent --name {a} --mask 255.255.255.255 --rsource --rcheck --seconds 600 --reap -j {a}")
        );
        assert!(rules.nat[&a][1].contains(&format!("-m recent --name {a} --set --mask 255.255.255.255 --rsource")));
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
        assert!(filter[0].starts_with("-d 10.96.0.20/32 -p tcp") && filter[0].ends_with("--dport 80 -j REJECT"));
        assert!(filter[1].contains("--dst-type LOCAL") && filter[1].ends_with("--dport 30080 -j REJECT"));
        assert_eq!(rules.nat.len(), 4, "only the fixed chains: {:?}", rules.nat.keys());
    }

    #[test]
    fn the_first_restore_writes_everything_and_removes_what_a_previous_run_left() {
        let port = web(vec![endpoint(5, true)]);
        let rules = render(std::slice::from_ref(&port), &context());
        let stale = chains_in_save(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:SKIFF-SVC-ABC123-0000000000 - [0:0]\n-A PREROUTING -j X\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n",
        );
        let input = restore_input(None, &rules, &stale).expect("a first write");
        let lines: Vec<&str> = input.lines().collect();
        assert_eq!(lines[0], "*nat");
        for name in rules.nat.keys() {
            assert!(lines.contains(&format!(":{name} - [0:0]").as_str()), "{name} declared");
        }
        assert!(lines.contains(&":SKIFF-SVC-ABC123-0000000000 - [0:0]"));
        assert!(lines.contains(&"-X SKIFF-SVC-ABC123-0000000000"));
        assert_eq!(lines.iter().filter(|l| **l == "COMMIT").count(), 2);
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("-A ")).count(),
            rules.nat.values().map(Vec::len).sum::<usize>()
        );
    }

    #[test]
    fn an_endpoint_change_rewrites_only_the_chains_it_touches() {
        let before = render(&[web(vec![endpoint(5, true), endpoint(6, false)])], &context());
        let after = render(&[web(vec![endpoint(5, true)])], &context());
        let input = restore_input(Some(&before), &after, &Rules::default()).expect("a change");
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
        assert_eq!(restore_input(Some(&after), &after, &Rules::default()), None, "nothing to write");
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
