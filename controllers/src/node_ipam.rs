//! Node IPAM: every Node gets its own pod CIDR (`spec.podCIDR` and
//! `spec.podCIDRs`), carved from `--cluster-cidr` in blocks of
//! `--node-cidr-mask-size` bits, as Kubernetes' range allocator does.
//!
//! [`CidrAllocator`] holds which blocks are taken. It is rebuilt on start
//! from the nodes already in the cache ([`CidrAllocator::occupy`] for each),
//! then [`CidrAllocator::reconcile`] gives a node without a CIDR the lowest
//! free block (a JSON merge patch of the node) and
//! [`CidrAllocator::release`] frees a deleted node's block. A block handed
//! out is remembered at once, so two nodes never get the same one even
//! before the patches come back through the cache. When no block is left,
//! the node gets a `CIDRNotAvailable` Warning Event and the caller an
//! [`IpamError::Exhausted`] to requeue it with back-off.
//!
//! The CIDR math is a few lines on `u128` addresses (IPv4 or IPv6), which
//! std::net does not offer and which needs no extra crate.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use crate::action::Action;

/// Kubernetes' `--node-cidr-mask-size` default for IPv4.
pub const DEFAULT_NODE_CIDR_MASK_SIZE: u8 = 24;

/// Why a CIDR could not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The flags name no usable range.
    #[error("invalid cluster CIDR {cidr:?} with node mask size {mask}: {reason}")]
    InvalidConfig { cidr: String, mask: u8, reason: String },
    /// Every block of the cluster CIDR is taken; `event` tells the node.
    #[error("no pod CIDR left in {cluster_cidr} for node {node}")]
    Exhausted { node: String, cluster_cidr: String, event: Box<Action> },
}

/// A CIDR as a network address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    v6: bool,
    base: u128,
    prefix: u8,
}

impl Cidr {
    fn parse(s: &str) -> Option<Cidr> {
        let (ip, prefix) = s.split_once('/')?;
        let ip: IpAddr = ip.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let (v6, base) = match ip {
            IpAddr::V4(v4) => (false, u32::from(v4) as u128),
            IpAddr::V6(v6) => (true, u128::from(v6)),
        };
        let cidr = Cidr { v6, base, prefix };
        (prefix <= cidr.bits()).then_some(Cidr { base: base & cidr.mask(), ..cidr })
    }

    fn bits(&self) -> u8 {
        if self.v6 {
            128
        } else {
            32
        }
    }

    /// The netmask of this prefix within the family's bits.
    fn mask(&self) -> u128 {
        let host = u32::from(self.bits() - self.prefix);
        let all = if self.v6 { u128::MAX } else { u32::MAX as u128 };
        if host >= 128 {
            0
        } else {
            all & !((1u128 << host) - 1)
        }
    }

    fn contains(&self, other: &Cidr) -> bool {
        self.v6 == other.v6 && other.prefix >= self.prefix && other.base & self.mask() == self.base
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ip = if self.v6 {
            IpAddr::from(self.base.to_be_bytes())
        } else {
            IpAddr::from((self.base as u32).to_be_bytes())
        };
        write!(f, "{ip}/{}", self.prefix)
    }
}

/// Which node blocks of the cluster CIDR are taken, and by whom.
#[derive(Debug)]
pub struct CidrAllocator {
    cluster: Cidr,
    node_prefix: u8,
    /// Block index → node name.
    taken: BTreeMap<u128, String>,
}

impl CidrAllocator {
    /// An allocator of `/node_mask` blocks of `cluster_cidr` (`10.244.0.0/16`).
    pub fn new(cluster_cidr: &str, node_mask: u8) -> Result<Self, IpamError> {
        let invalid = |reason: &str| IpamError::InvalidConfig {
            cidr: cluster_cidr.to_string(),
            mask: node_mask,
            reason: reason.to_string(),
        };
        let cluster = Cidr::parse(cluster_cidr).ok_or_else(|| invalid("not a CIDR"))?;
        if node_mask < cluster.prefix || node_mask > cluster.bits() {
            return Err(invalid("the node mask must be between the cluster prefix and the address size"));
        }
        if node_mask - cluster.prefix > 64 {
            return Err(invalid("more than 2^64 node blocks"));
        }
        Ok(CidrAllocator { cluster, node_prefix: node_mask, taken: BTreeMap::new() })
    }

    /// How many node blocks the cluster CIDR holds.
    pub fn capacity(&self) -> u128 {
        1u128 << (self.node_prefix - self.cluster.prefix)
    }

    fn block(&self, index: u128) -> Cidr {
        let size = 1u128 << (self.cluster.bits() - self.node_prefix);
        Cidr { v6: self.cluster.v6, base: self.cluster.base + index * size, prefix: self.node_prefix }
    }

    /// The block index of a CIDR of ours, if it is one.
    fn index_of(&self, cidr: &str) -> Option<u128> {
        let cidr = Cidr::parse(cidr)?;
        if cidr.prefix != self.node_prefix || !self.cluster.contains(&cidr) {
            return None;
        }
        Some((cidr.base - self.cluster.base) >> (self.cluster.bits() - self.node_prefix))
    }

    fn node_cidr(node: &Node) -> Option<&str> {
        node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).filter(|c| !c.is_empty())
    }

    /// Records the block a node already has (on start, from the cache).
    /// A CIDR outside the cluster range is left as it is, unrecorded.
    pub fn occupy(&mut self, node: &Node) {
        let (Some(name), Some(cidr)) = (node.metadata.name.as_deref(), Self::node_cidr(node)) else { return };
        if let Some(index) = self.index_of(cidr) {
            self.taken.insert(index, name.to_string());
        }
    }

    /// Frees the block of a deleted node.
    pub fn release(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else { return };
        self.taken.retain(|_, holder| holder != name);
    }

    /// A node without a pod CIDR gets the lowest free block (or the one
    /// already handed to it, if the patch is still on its way).
    pub fn reconcile(&mut self, node: &Node) -> Result<Vec<Action>, IpamError> {
        let Some(name) = node.metadata.name.clone() else { return Ok(vec![]) };
        if Self::node_cidr(node).is_some() {
            self.occupy(node);
            return Ok(vec![]);
        }
        let index = match self.taken.iter().find(|(_, holder)| **holder == name) {
            Some((index, _)) => *index,
            None => {
                // Among the first taken+1 indices one is free, unless full.
                let candidates = (self.taken.len() as u128 + 1).min(self.capacity());
                let Some(index) = (0..candidates).find(|i| !self.taken.contains_key(i)) else {
                    let cluster_cidr = self.cluster.to_string();
                    let message = format!("Node {name} status is now: CIDRNotAvailable");
                    let event = Action::event_about(node, "Warning", "CIDRNotAvailable", message);
                    return Err(IpamError::Exhausted { node: name, cluster_cidr, event: Box::new(event) });
                };
                self.taken.insert(index, name.clone());
                index
            }
        };
        let cidr = self.block(index).to_string();
        Ok(vec![Action::Patch {
            api_version: "v1".into(),
            kind: "Node".into(),
            namespace: String::new(),
            name,
            patch: json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}),
        }])
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeSpec;

    use super::*;

    fn node(name: &str, cidr: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.spec = Some(NodeSpec { pod_cidr: cidr.map(str::to_string), ..Default::default() });
        node
    }

    fn assigned(actions: Vec<Action>) -> String {
        match &actions[..] {
            [Action::Patch { patch, .. }] => {
                assert_eq!(patch["spec"]["podCIDRs"][0], patch["spec"]["podCIDR"]);
                patch["spec"]["podCIDR"].as_str().unwrap().to_string()
            }
            other => panic!("expected one patch, got {other:?}"),
        }
    }

    #[test]
    fn nodes_get_distinct_blocks_in_order() {
        let mut ipam = CidrAllocator::new("10.244.0.0/16", 24).unwrap();
        assert_eq!(ipam.capacity(), 256);
        assert_eq!(assigned(ipam.reconcile(&node("a", None)).unwrap()), "10.244.0.0/24");
        assert_eq!(assigned(ipam.reconcile(&node("b", None)).unwrap()), "10.244.1.0/24");
        // Asked again before the patch is seen: the same block, not a new one.
        assert_eq!(assigned(ipam.reconcile(&node("a", None)).unwrap()), "10.244.0.0/24");
    }

    #[test]
    fn blocks_already_held_are_skipped_after_a_restart() {
        let mut ipam = CidrAllocator::new("10.244.0.0/16", 24).unwrap();
        ipam.occupy(&node("a", Some("10.244.0.0/24")));
        ipam.occupy(&node("c", Some("10.244.2.0/24")));
        ipam.occupy(&node("foreign", Some("192.168.0.0/24")));
        assert_eq!(assigned(ipam.reconcile(&node("b", None)).unwrap()), "10.244.1.0/24");
        assert_eq!(assigned(ipam.reconcile(&node("d", None)).unwrap()), "10.244.3.0/24");
        assert!(ipam.reconcile(&node("a", Some("10.244.0.0/24"))).unwrap().is_empty());
    }

    #[test]
    fn a_deleted_nodes_block_is_handed_out_again() {
        let mut ipam = CidrAllocator::new("10.244.0.0/23", 24).unwrap();
        ipam.occupy(&node("a", Some("10.244.0.0/24")));
        ipam.occupy(&node("b", Some("10.244.1.0/24")));
        ipam.release(&node("a", Some("10.244.0.0/24")));
        assert_eq!(assigned(ipam.reconcile(&node("c", None)).unwrap()), "10.244.0.0/24");
    }

    #[test]
    fn exhaustion_is_an_error_carrying_a_warning_event() {
        let mut ipam = CidrAllocator::new("10.244.0.0/24", 25).unwrap();
        ipam.reconcile(&node("a", None)).unwrap();
        ipam.reconcile(&node("b", None)).unwrap();
        let err = ipam.reconcile(&node("c", None)).unwrap_err();
        let IpamError::Exhausted { node, cluster_cidr, event } = &err else { panic!("{err}") };
        assert_eq!((node.as_str(), cluster_cidr.as_str()), ("c", "10.244.0.0/24"));
        assert!(
            matches!(&**event, Action::Event { type_, reason, .. } if type_ == "Warning" && reason == "CIDRNotAvailable")
        );
    }

    #[test]
    fn ipv6_ranges_and_bad_flags() {
        let mut ipam = CidrAllocator::new("fd00:10:244::/56", 64).unwrap();
        ipam.reconcile(&node("a", None)).unwrap();
        assert_eq!(assigned(ipam.reconcile(&node("b", None)).unwrap()), "fd00:10:244:1::/64");
        assert!(matches!(CidrAllocator::new("10.244.0.0/16", 8), Err(IpamError::InvalidConfig { .. })));
        assert!(matches!(CidrAllocator::new("10.244.0.0", 24), Err(IpamError::InvalidConfig { .. })));
        assert!(matches!(CidrAllocator::new("10.244.0.0/16", 33), Err(IpamError::InvalidConfig { .. })));
    }
}
