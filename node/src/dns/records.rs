//! The cluster's DNS records, as the Kubernetes DNS specification
//! (<https://github.com/kubernetes/dns/blob/master/docs/specification.md>)
//! derives them from Services and EndpointSlices: an immutable table
//! rebuilt whole on every change and answered from without I/O.
//!
//! Under the cluster domain (`cluster.local`):
//! - `<svc>.<ns>.svc`: the ClusterIPs (A, AAAA); a headless Service's
//!   ready endpoint addresses; an ExternalName Service's CNAME.
//! - `<hostname>.<svc>.<ns>.svc`: a headless Service's ready endpoint,
//!   named by its `hostname` or, without one, its dashed address.
//! - `_<port>._<proto>.<svc>.<ns>.svc`: SRV for each named port, to the
//!   Service (ClusterIP) or to each ready endpoint (headless), with the
//!   targets' addresses as additionals.
//! - `<a-b-c-d>.<ns>.pod`: any dashed address, unchecked (CoreDNS's
//!   `pods insecure`).
//! - `dns-version`: the specification's TXT record; the apex holds an SOA,
//!   also returned with negative answers so resolvers cache them for
//!   [`TTL`].
//!
//! Reverse names (`in-addr.arpa`, `ip6.arpa`) of ClusterIPs and of
//! headless endpoints with a hostname hold PTRs. A name under the domain
//! that is not held is NXDOMAIN; a held name without the asked type, or a
//! name with held names below it (`<ns>.svc`), is NODATA. Everything else,
//! reverse names of addresses that are not the cluster's included, is not
//! ours and goes to the upstream servers. Names compare case-insensitively
//! (hickory's `Name` equality and hash ignore case).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Label, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Every record's TTL, and the negative-caching TTL: CoreDNS's kubernetes
/// plugin's default, short enough that clients follow endpoint changes.
pub const TTL: u32 = 5;

/// The label tying an EndpointSlice to its Service (same namespace).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The specification's version, served at `dns-version.<domain>`.
const SCHEMA_VERSION: &str = "1.1.0";

/// How many CNAMEs an answer follows within the table.
const MAX_CNAME_CHAIN: usize = 8;

/// The answer to one question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The name holds records of the type (or a CNAME).
    Answer {
        /// The records answering, owned by the name as asked.
        answers: Vec<Record>,
        /// The addresses of SRV targets.
        additionals: Vec<Record>,
    },
    /// The name exists but holds no record of the type.
    NoData,
    /// The name is under the cluster domain and does not exist.
    NxDomain,
    /// The name is not the cluster's: forward it.
    NotOurs,
}

/// The cluster's records, built once per change of Services or slices.
#[derive(Clone, Debug)]
pub struct Records {
    /// The cluster domain, lowercase and fully qualified; `None` when the
    /// configured one is not a domain name, and then nothing is ours.
    domain: Option<Name>,
    /// `pod.<domain>`: names below it are answered from the name itself.
    pods: Option<Name>,
    /// The apex SOA, for negative answers.
    soa: Option<Record>,
    /// Every name held, with its records. Names that exist without records
    /// (a Service with no ready endpoint, `<ns>.svc` above a Service) map
    /// to an empty list, so that they answer NODATA, not NXDOMAIN.
    names: HashMap<Name, Vec<Record>>,
}

impl Records {
    /// The records of `services` and their `slices` under `domain`
    /// (`cluster.local`, a trailing dot or not). An invalid domain gives a
    /// table that owns nothing (every name is forwarded); callers check
    /// the domain first with [`parse_domain`].
    pub fn build(domain: &str, services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> Records {
        let Some(domain) = parse_domain(domain) else {
            return Records { domain: None, pods: None, soa: None, names: HashMap::new() };
        };
        let mut table = Table { domain: domain.clone(), names: HashMap::new() };
        let soa = table.apex(&domain);
        let mut slices_of: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for slice in slices {
            let labels = slice.metadata.labels.as_ref();
            if let (Some(ns), Some(service)) =
                (slice.metadata.namespace.as_deref(), labels.and_then(|l| l.get(SERVICE_NAME_LABEL)))
            {
                slices_of.entry((ns, service.as_str())).or_default().push(slice);
            }
        }
        for service in services {
            let (Some(ns), Some(name)) = (service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
            else {
                continue;
            };
            let slices = slices_of.get(&(ns, name)).map(Vec::as_slice).unwrap_or_default();
            table.service(ns, name, service, slices);
        }
        let pods = child(&domain, "pod");
        if let Some(pods) = &pods {
            table.exists(pods.clone());
        }
        Records { domain: Some(domain), pods, soa, names: table.names }
    }

    /// The answer to `rtype` of `name` (any case, fully qualified or not).
    pub fn lookup(&self, name: &Name, rtype: RecordType) -> Lookup {
        let Some(domain) = &self.domain else { return Lookup::NotOurs };
        let mut asked = name.clone();
        asked.set_fqdn(true);
        if let Some(held) = self.names.get(&asked) {
            return self.answer(&asked, held, rtype);
        }
        if let Some(pods) = self.pods.as_ref().filter(|pods| pods.zone_of(&asked)) {
            return pod(&asked, pods, rtype);
        }
        if domain.zone_of(&asked) {
            Lookup::NxDomain
        } else {
            Lookup::NotOurs
        }
    }

    /// The apex SOA, if `name` is under the cluster domain: what a
    /// negative answer carries in its authority section.
    pub fn soa_for(&self, name: &Name) -> Option<&Record> {
        self.soa.as_ref().filter(|soa| soa.name.zone_of(name))
    }

    /// `held`'s records of `rtype`, or its CNAME followed within the table.
    fn answer(&self, asked: &Name, held: &[Record], rtype: RecordType) -> Lookup {
        let mut answers: Vec<Record> = held.iter().filter(|r| matches(r, rtype)).cloned().collect();
        if answers.is_empty() && rtype != RecordType::CNAME {
            let mut next = cname(held);
            for _ in 0..MAX_CNAME_CHAIN {
                let Some((record, target)) = next.take() else { break };
                answers.push(record);
                let Some(held) = self.names.get(&target) else { break };
                let found = held.iter().filter(|r| matches(r, rtype)).cloned();
                let before = answers.len();
                answers.extend(found);
                if answers.len() == before {
                    next = cname(held);
                }
            }
        }
        if answers.is_empty() {
            return Lookup::NoData;
        }
        // Owned by the name as asked (its case), as the question is.
        for record in answers.iter_mut().filter(|r| r.name == *asked) {
            record.name = asked.clone();
        }
        let mut additionals: Vec<Record> = Vec::new();
        for answer in &answers {
            let RData::SRV(srv) = &answer.data else { continue };
            for record in self.names.get(&srv.target).into_iter().flatten() {
                if matches!(record.data, RData::A(_) | RData::AAAA(_)) && !additionals.contains(record) {
                    additionals.push(record.clone());
                }
            }
        }
        Lookup::Answer { answers, additionals }
    }
}

/// `domain` as a lowercase fully qualified name of at least one label.
pub fn parse_domain(domain: &str) -> Option<Name> {
    let mut name = Name::from_ascii(domain).ok().filter(|n| !n.is_root())?.to_lowercase();
    name.set_fqdn(true);
    Some(name)
}

/// The CNAME among `held`, and its target.
fn cname(held: &[Record]) -> Option<(Record, Name)> {
    held.iter().find_map(|r| match &r.data {
        RData::CNAME(CNAME(target)) => Some((r.clone(), target.clone())),
        _ => None,
    })
}

/// Whether `record` answers `rtype`.
fn matches(record: &Record, rtype: RecordType) -> bool {
    rtype == RecordType::ANY || record.record_type() == rtype
}

/// The answer for `asked` under `pods` (`pod.<domain>`): `<ns>.pod` exists
/// for any namespace, `<a-b-c-d>.<ns>.pod` is that address.
fn pod(asked: &Name, pods: &Name, rtype: RecordType) -> Lookup {
    let below = usize::from(asked.num_labels().saturating_sub(pods.num_labels()));
    if below < 2 {
        return Lookup::NoData;
    }
    let Some(first) = asked.iter().next().filter(|_| below == 2) else { return Lookup::NxDomain };
    let Ok(dashed) = std::str::from_utf8(first) else { return Lookup::NxDomain };
    let Some(ip) = undash(dashed) else { return Lookup::NxDomain };
    let record = Record::from_rdata(asked.clone(), TTL, address(ip));
    if matches(&record, rtype) {
        Lookup::Answer { answers: vec![record], additionals: vec![] }
    } else {
        Lookup::NoData
    }
}

/// `10-1-2-3` as 10.1.2.3, `fd00--1` as fd00::1.
fn undash(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    label.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// An address as a label: `10.1.2.3` as `10-1-2-3`, `fd00::1` as `fd00--1`.
fn dash(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// The A or AAAA data of `ip`.
fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// `label.parent`, lowercase; `None` if `label` is not a valid label.
fn child(parent: &Name, label: &str) -> Option<Name> {
    let label = Label::from_ascii(label).ok()?;
    parent.prepend_label(label).ok().map(|n| n.to_lowercase())
}

/// `labels` (leftmost first) prepended to `parent`.
fn descendant(parent: &Name, labels: &[&str]) -> Option<Name> {
    labels.iter().rev().try_fold(parent.clone(), |name, label| child(&name, label))
}

/// A Service port or an endpoint port: its name and lowercase protocol.
type PortKey = (String, String);

/// One ready endpoint address of a headless Service.
struct Endpoint {
    ip: IpAddr,
    /// Its `hostname`, if set: only those get a PTR.
    hostname: Option<String>,
    /// Its named ports (from its slice), by name and protocol.
    ports: BTreeMap<PortKey, u16>,
}

/// The table being built.
struct Table {
    domain: Name,
    names: HashMap<Name, Vec<Record>>,
}

impl Table {
    /// Adds `data` at `name`, and makes `name`'s ancestors under the
    /// domain exist.
    fn add(&mut self, name: Name, data: RData) {
        self.insert(name.clone(), data);
        self.exists(name);
    }

    /// Adds `data` at `name` alone, once.
    fn insert(&mut self, name: Name, data: RData) {
        let record = Record::from_rdata(name.clone(), TTL, data);
        let held = self.names.entry(name).or_default();
        if !held.contains(&record) {
            held.push(record);
        }
    }

    /// Makes `name` and its ancestors down to the domain exist.
    fn exists(&mut self, mut name: Name) {
        while self.domain.zone_of(&name) {
            self.names.entry(name.clone()).or_default();
            name = name.base_name();
        }
    }

    /// A PTR from `ip`'s reverse name to `target`; no ancestor is made to
    /// exist (other reverse names are forwarded).
    fn reverse(&mut self, ip: IpAddr, target: &Name) {
        let mut name = Name::from(ip);
        name.set_fqdn(true);
        self.insert(name, RData::PTR(PTR(target.clone())));
    }

    /// The apex's SOA and the `dns-version` TXT; returns the SOA.
    fn apex(&mut self, domain: &Name) -> Option<Record> {
        let (mname, rname) = (descendant(domain, &["ns", "dns"])?, child(domain, "hostmaster")?);
        // Serial 1: nothing transfers this zone. Minimum: the negative TTL.
        let soa = RData::SOA(SOA::new(mname, rname, 1, 7200, 1800, 86400, TTL));
        self.add(domain.clone(), soa.clone());
        if let Some(version) = child(domain, "dns-version") {
            self.add(version, RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])));
        }
        Some(Record::from_rdata(domain.clone(), TTL, soa))
    }

    /// The records of one Service and its slices.
    fn service(&mut self, ns: &str, name: &str, service: &Service, slices: &[&EndpointSlice]) {
        let Some(owner) = descendant(&self.domain, &[name, ns, "svc"]) else { return };
        self.exists(owner.clone());
        let Some(spec) = &service.spec else { return };
        if spec.type_.as_deref() == Some("ExternalName") {
            let target = spec.external_name.as_deref().and_then(|n| Name::from_ascii(n).ok());
            if let Some(mut target) = target.filter(|t| !t.is_root()) {
                target.set_fqdn(true);
                self.add(owner, RData::CNAME(CNAME(target.to_lowercase())));
            }
            return;
        }
        let ports: Vec<(PortKey, u16)> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| Some((port_key(p.name.as_deref()?, p.protocol.as_deref())?, u16::try_from(p.port).ok()?)))
            .collect();
        if spec.cluster_ip.as_deref() == Some("None") {
            for endpoint in ready_endpoints(slices) {
                self.add(owner.clone(), address(endpoint.ip));
                let label = endpoint.hostname.clone().unwrap_or_else(|| dash(endpoint.ip));
                let Some(host) = child(&owner, &label) else { continue };
                self.add(host.clone(), address(endpoint.ip));
                if endpoint.hostname.is_some() {
                    self.reverse(endpoint.ip, &host);
                }
                for (key, _) in &ports {
                    if let (Some(port), Some(srv)) = (endpoint.ports.get(key), srv_name(&owner, key)) {
                        self.add(srv, RData::SRV(SRV::new(0, 100, *port, host.clone())));
                    }
                }
            }
            return;
        }
        let ips = match spec.cluster_ips.as_deref() {
            Some(ips) if !ips.is_empty() => ips.to_vec(),
            _ => spec.cluster_ip.clone().into_iter().collect(),
        };
        for ip in ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()) {
            self.add(owner.clone(), address(ip));
            self.reverse(ip, &owner);
        }
        for (key, port) in &ports {
            if let Some(srv) = srv_name(&owner, key) {
                self.add(srv, RData::SRV(SRV::new(0, 100, *port, owner.clone())));
            }
        }
    }
}

/// A named port's key: its name and its protocol, lowercase (TCP if unset).
fn port_key(name: &str, protocol: Option<&str>) -> Option<PortKey> {
    (!name.is_empty()).then(|| (name.to_string(), protocol.unwrap_or("TCP").to_ascii_lowercase()))
}

/// `_<port>._<proto>.<owner>`.
fn srv_name(owner: &Name, (port, protocol): &PortKey) -> Option<Name> {
    descendant(owner, &[&format!("_{port}"), &format!("_{protocol}")])
}

/// The ready endpoint addresses of `slices` (`ready` unset counts as
/// ready), each address once, in address order.
fn ready_endpoints(slices: &[&EndpointSlice]) -> Vec<Endpoint> {
    let mut endpoints: BTreeMap<(IpAddr, Option<String>), BTreeMap<PortKey, u16>> = BTreeMap::new();
    for slice in slices {
        let ports: BTreeMap<PortKey, u16> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| Some((port_key(p.name.as_deref()?, p.protocol.as_deref())?, u16::try_from(p.port?).ok()?)))
            .collect();
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            let hostname = endpoint.hostname.clone().filter(|h| !h.is_empty());
            for ip in endpoint.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                endpoints.entry((ip, hostname.clone())).or_default().extend(ports.clone());
            }
        }
    }
    endpoints.into_iter().map(|((ip, hostname), ports)| Endpoint { ip, hostname, ports }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(ns: &str, name: &str, spec: serde_json::Value) -> Arc<Service> {
        Arc::new(serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap())
    }

    fn slice(ns: &str, service: &str, endpoints: serde_json::Value, ports: serde_json::Value) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": format!("{service}-x"), "labels": {SERVICE_NAME_LABEL: service}},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports,
            }))
            .unwrap(),
        )
    }

    /// web (ClusterIP, dual-stack, named port), v4only, db (headless, one
    /// not-ready endpoint, one hostname), ext (ExternalName), empty
    /// (headless, no slice).
    fn must_records() -> Records {
        let services = [
            service(
                "default",
                "web",
                json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]}),
            ),
            service("default", "v4only", json!({"clusterIP": "10.96.0.11"})),
            service(
                "prod",
                "db",
                json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}),
            ),
            service("prod", "ext", json!({"type": "ExternalName", "externalName": "db.example.com"})),
            service("prod", "empty", json!({"clusterIP": "None"})),
        ];
        let slices = [
            slice(
                "prod",
                "db",
                json!([
                    {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["10.244.1.6"]},
                    {"addresses": ["10.244.1.7"], "conditions": {"ready": false}},
                ]),
                json!([{"name": "pg", "port": 15432, "protocol": "TCP"}]),
            ),
            // Same name, other namespace: not db's.
            slice("default", "db", json!([{"addresses": ["10.244.9.9"]}]), json!([])),
        ];
        Records::build("Cluster.Local.", &services, &slices)
    }

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn must_answer(lookup: Lookup) -> (Vec<String>, Vec<String>) {
        let Lookup::Answer { answers, additionals } = lookup else { panic!("not an answer: {lookup:?}") };
        let show = |records: Vec<Record>| -> Vec<String> {
            records.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect()
        };
        (show(answers), show(additionals))
    }

    #[test]
    fn a_cluster_ip_service_answers_its_address() {
        let records = must_records();
        let (answers, additionals) =
            must_answer(records.lookup(&name("web.default.svc.cluster.local."), RecordType::A));
        assert_eq!(answers, ["web.default.svc.cluster.local. A 10.96.0.10"]);
        assert!(additionals.is_empty());
        let answer = records.lookup(&name("web.default.svc.cluster.local"), RecordType::A);
        let Lookup::Answer { answers, .. } = answer else { panic!() };
        assert_eq!(answers[0].ttl, TTL);
    }

    #[test]
    fn aaaa_answers_an_ipv6_cluster_ip_and_is_nodata_where_only_a_is_held() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("web.default.svc.cluster.local."), RecordType::AAAA));
        assert_eq!(answers, ["web.default.svc.cluster.local. AAAA fd00::10"]);
        assert_eq!(records.lookup(&name("v4only.default.svc.cluster.local."), RecordType::AAAA), Lookup::NoData);
        assert_eq!(records.lookup(&name("v4only.default.svc.cluster.local."), RecordType::MX), Lookup::NoData);
    }

    #[test]
    fn a_headless_service_answers_its_ready_endpoints_only() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("db.prod.svc.cluster.local."), RecordType::A));
        assert_eq!(answers, ["db.prod.svc.cluster.local. A 10.244.1.5", "db.prod.svc.cluster.local. A 10.244.1.6"]);
        // The not-ready one has no name of its own either.
        assert_eq!(records.lookup(&name("10-244-1-7.db.prod.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        // A headless service without endpoints exists: NODATA.
        assert_eq!(records.lookup(&name("empty.prod.svc.cluster.local."), RecordType::A), Lookup::NoData);
    }

    #[test]
    fn endpoints_are_named_by_hostname_or_dashed_address() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("db-0.db.prod.svc.cluster.local."), RecordType::A));
        assert_eq!(answers, ["db-0.db.prod.svc.cluster.local. A 10.244.1.5"]);
        let (answers, _) = must_answer(records.lookup(&name("10-244-1-6.db.prod.svc.cluster.local."), RecordType::A));
        assert_eq!(answers, ["10-244-1-6.db.prod.svc.cluster.local. A 10.244.1.6"]);
    }

    #[test]
    fn an_external_name_service_is_a_cname_for_any_type() {
        let records = must_records();
        for rtype in [RecordType::CNAME, RecordType::A, RecordType::AAAA] {
            let (answers, _) = must_answer(records.lookup(&name("ext.prod.svc.cluster.local."), rtype));
            assert_eq!(answers, ["ext.prod.svc.cluster.local. CNAME db.example.com."], "{rtype}");
        }
    }

    #[test]
    fn a_cname_into_the_domain_is_followed_within_the_table() {
        let services = [
            service("default", "web", json!({"clusterIP": "10.96.0.10"})),
            service(
                "default",
                "alias",
                json!({"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}),
            ),
        ];
        let records = Records::build("cluster.local", &services, &[]);
        let (answers, _) = must_answer(records.lookup(&name("alias.default.svc.cluster.local."), RecordType::A));
        assert_eq!(
            answers,
            [
                "alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.",
                "web.default.svc.cluster.local. A 10.96.0.10"
            ]
        );
    }

    #[test]
    fn srv_of_a_cluster_ip_service_targets_the_service_with_its_address_additional() {
        let records = must_records();
        let (answers, additionals) =
            must_answer(records.lookup(&name("_http._tcp.web.default.svc.cluster.local."), RecordType::SRV));
        assert_eq!(answers, ["_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."]);
        assert_eq!(
            additionals,
            ["web.default.svc.cluster.local. A 10.96.0.10", "web.default.svc.cluster.local. AAAA fd00::10"]
        );
        // The unnamed port has none; `_tcp.web` exists above `_http._tcp.web`.
        assert_eq!(records.lookup(&name("_tcp.web.default.svc.cluster.local."), RecordType::SRV), Lookup::NoData);
        assert_eq!(
            records.lookup(&name("_https._tcp.web.default.svc.cluster.local."), RecordType::SRV),
            Lookup::NxDomain
        );
    }

    #[test]
    fn srv_of_a_headless_service_targets_each_ready_endpoint_at_its_endpoint_port() {
        let records = must_records();
        let (answers, additionals) =
            must_answer(records.lookup(&name("_pg._tcp.db.prod.svc.cluster.local."), RecordType::SRV));
        assert_eq!(
            answers,
            [
                "_pg._tcp.db.prod.svc.cluster.local. SRV 0 100 15432 db-0.db.prod.svc.cluster.local.",
                "_pg._tcp.db.prod.svc.cluster.local. SRV 0 100 15432 10-244-1-6.db.prod.svc.cluster.local.",
            ]
        );
        assert_eq!(
            additionals,
            ["db-0.db.prod.svc.cluster.local. A 10.244.1.5", "10-244-1-6.db.prod.svc.cluster.local. A 10.244.1.6"]
        );
    }

    #[test]
    fn ptr_names_cluster_ips_and_headless_endpoints_with_a_hostname() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("10.0.96.10.in-addr.arpa."), RecordType::PTR));
        assert_eq!(answers, ["10.0.96.10.in-addr.arpa. PTR web.default.svc.cluster.local."]);
        let (answers, _) = must_answer(records.lookup(&name("5.1.244.10.in-addr.arpa."), RecordType::PTR));
        assert_eq!(answers, ["5.1.244.10.in-addr.arpa. PTR db-0.db.prod.svc.cluster.local."]);
        let v6 = Name::from("fd00::10".parse::<IpAddr>().unwrap());
        let (answers, _) = must_answer(records.lookup(&v6, RecordType::PTR));
        assert_eq!(answers.len(), 1);
        // No hostname, no PTR; an address that is not the cluster's is forwarded.
        assert_eq!(records.lookup(&name("6.1.244.10.in-addr.arpa."), RecordType::PTR), Lookup::NotOurs);
        assert_eq!(records.lookup(&name("1.2.0.192.in-addr.arpa."), RecordType::PTR), Lookup::NotOurs);
    }

    #[test]
    fn pod_names_answer_the_address_they_spell() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("10-244-3-4.any.pod.cluster.local."), RecordType::A));
        assert_eq!(answers, ["10-244-3-4.any.pod.cluster.local. A 10.244.3.4"]);
        let (answers, _) = must_answer(records.lookup(&name("fd00--4.any.pod.cluster.local."), RecordType::AAAA));
        assert_eq!(answers, ["fd00--4.any.pod.cluster.local. AAAA fd00::4"]);
        assert_eq!(records.lookup(&name("10-244-3-4.any.pod.cluster.local."), RecordType::AAAA), Lookup::NoData);
        assert_eq!(records.lookup(&name("any.pod.cluster.local."), RecordType::A), Lookup::NoData);
        assert_eq!(records.lookup(&name("not-an-ip.any.pod.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(records.lookup(&name("x.10-244-3-4.any.pod.cluster.local."), RecordType::A), Lookup::NxDomain);
    }

    #[test]
    fn missing_names_under_the_domain_are_nxdomain_and_their_parents_nodata() {
        let records = must_records();
        assert_eq!(records.lookup(&name("nope.default.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(records.lookup(&name("nope.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(records.lookup(&name("example.com.default.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        // A slice of another namespace's service does not make it exist.
        assert_eq!(records.lookup(&name("db.default.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(records.lookup(&name("default.svc.cluster.local."), RecordType::A), Lookup::NoData);
        assert!(records.soa_for(&name("nope.default.svc.cluster.local.")).is_some());
        assert!(records.soa_for(&name("example.com.")).is_none());
    }

    #[test]
    fn the_apex_holds_an_soa_and_the_schema_version() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("cluster.local."), RecordType::SOA));
        assert_eq!(answers.len(), 1);
        let (answers, _) = must_answer(records.lookup(&name("dns-version.cluster.local."), RecordType::TXT));
        assert_eq!(answers, ["dns-version.cluster.local. TXT 1.1.0"]);
    }

    #[test]
    fn names_match_in_any_case_and_answers_keep_the_case_asked() {
        let records = must_records();
        let (answers, _) = must_answer(records.lookup(&name("WEB.Default.SVC.cluster.LOCAL."), RecordType::A));
        assert_eq!(answers, ["WEB.Default.SVC.cluster.LOCAL. A 10.96.0.10"]);
    }

    #[test]
    fn names_outside_the_domain_are_not_ours() {
        let records = must_records();
        assert_eq!(records.lookup(&name("example.com."), RecordType::A), Lookup::NotOurs);
        assert_eq!(records.lookup(&name("local."), RecordType::A), Lookup::NotOurs);
        let invalid = Records::build(".", &[], &[]);
        assert_eq!(invalid.lookup(&name("web.default.svc.cluster.local."), RecordType::A), Lookup::NotOurs);
    }
}
