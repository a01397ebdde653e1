//! Network partitions for real processes: each member runs in its own
//! network namespace, joined to a bridge in the root namespace by a veth
//! pair. Isolating a member takes its veth down; a majority/minority split
//! moves the minority's veths to a second bridge, so the minority still
//! talks among itself. The test process reaches every member through the
//! bridge's address. Needs root and iproute2 (`ip`); everything is removed
//! on drop.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

pub struct Network {
    /// Short unique prefix of every device and namespace name.
    prefix: String,
    subnet: u8,
    main_bridge: String,
    minority_bridge: String,
    /// Member id → (namespace, host-side veth, address).
    members: BTreeMap<u64, (String, String, String)>,
}

impl Network {
    /// A bridge and one namespace per member id, members at 10.<subnet>.0.<id>.
    pub fn create(ids: &[u64]) -> Result<Network, String> {
        // Unique per process and per network in it, so tests of one file
        // may each have their own at once.
        static CREATED: AtomicU32 = AtomicU32::new(0);
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let subnet = 100 + ((pid + 37 * n) % 100) as u8;
        let prefix = format!("sk{}x{n}", pid % 10_000);
        let mut net = Network {
            main_bridge: format!("{prefix}b0"),
            minority_bridge: format!("{prefix}b1"),
            prefix,
            subnet,
            members: BTreeMap::new(),
        };
        for bridge in [net.main_bridge.clone(), net.minority_bridge.clone()] {
            ip(&["link", "add", &bridge, "type", "bridge"])?;
            ip(&["link", "set", &bridge, "up"])?;
        }
        ip(&["addr", "add", &format!("10.{subnet}.0.254/24"), "dev", &net.main_bridge])?;
        for id in ids {
            net.add(*id)?;
        }
        Ok(net)
    }

    /// A namespace for one more member (one joining later).
    pub fn add(&mut self, id: u64) -> Result<String, String> {
        let ns = format!("{}n{id}", self.prefix);
        let host = format!("{}v{id}", self.prefix);
        let peer = format!("{}p{id}", self.prefix);
        let addr = self.address_of(id);
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &ns])?;
        ip(&["link", "set", &host, "master", &self.main_bridge])?;
        ip(&["link", "set", &host, "up"])?;
        ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{addr}/24"), "dev", &peer])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", &peer, "up"])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        self.members.insert(id, (ns.clone(), host, addr.clone()));
        Ok(addr)
    }

    pub fn namespace(&self, id: u64) -> &str {
        &self.members[&id].0
    }

    pub fn address(&self, id: u64) -> &str {
        &self.members[&id].2
    }

    /// The address member `id` has, or will have once added.
    fn address_of(&self, id: u64) -> String {
        format!("10.{}.0.{id}", self.subnet)
    }

    /// Every address a member of this network can have (ids 1 to 253): what
    /// a certificate for members that join later must name.
    pub fn member_addresses(&self) -> Vec<String> {
        (1..=253).map(|id| self.address_of(id)).collect()
    }

    /// Cuts `ids` off from everyone, the test process included.
    pub fn isolate(&self, ids: &[u64]) -> Result<(), String> {
        for id in ids {
            ip(&["link", "set", &self.members[id].1, "down"])?;
        }
        Ok(())
    }

    /// Splits the members: `minority` can reach only each other (and not
    /// the test process); the rest are unaffected.
    pub fn split(&self, minority: &[u64]) -> Result<(), String> {
        for id in minority {
            ip(&["link", "set", &self.members[id].1, "master", &self.minority_bridge])?;
        }
        Ok(())
    }

    /// Everyone back on the main bridge, every link up.
    pub fn heal(&self) -> Result<(), String> {
        for (_, host, _) in self.members.values() {
            ip(&["link", "set", host, "master", &self.main_bridge])?;
            ip(&["link", "set", host, "up"])?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for (ns, host, _) in self.members.values() {
            let _ = ip(&["link", "del", host]);
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.main_bridge]);
        let _ = ip(&["link", "del", &self.minority_bridge]);
    }
}
