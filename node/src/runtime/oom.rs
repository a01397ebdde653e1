//! The kernel's own record of OOM kills, read from `/dev/kmsg` as
//! cadvisor's oomparser reads it for the kubelet.
//!
//! Why: containerd learns of an OOM kill from the shim, which watches the
//! container's memory cgroup. On cgroup v1 the shim's notification also
//! fires when that cgroup is removed after the exit, and then it sends no
//! OOM event: the container's status keeps the reason `Error` for a
//! container the OOM killer ended (about one run in three on this VM). The
//! kernel logs every kill with the victim's cgroup, whose last component
//! is the container's id, before the victim dies; a container that exited
//! 137 and appears here was OOM-killed.
//!
//! One reader thread per process, started by [`watch`]; it reads the
//! kernel's buffer from its start (so a restarted agent still finds the
//! kills of containers it adopts) and then waits for new records. Without
//! `/dev/kmsg` (not root, or a container without it) nothing is found and
//! statuses are containerd's.

use std::collections::{HashSet, VecDeque};
use std::io::Read;
use std::sync::{Mutex, Once, OnceLock};

/// Container ids remembered; the oldest are forgotten past this.
const REMEMBERED: usize = 4096;

#[derive(Default)]
struct Kills {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

fn kills() -> &'static Mutex<Kills> {
    static KILLS: OnceLock<Mutex<Kills>> = OnceLock::new();
    KILLS.get_or_init(Mutex::default)
}

fn remember(id: String) {
    let mut kills = kills().lock().unwrap_or_else(|e| e.into_inner());
    if kills.ids.insert(id.clone()) {
        kills.order.push_back(id);
        if kills.order.len() > REMEMBERED {
            if let Some(old) = kills.order.pop_front() {
                kills.ids.remove(&old);
            }
        }
    }
}

/// Whether the kernel logged an OOM kill in the container `id`'s cgroup.
pub fn killed(id: &str) -> bool {
    !id.is_empty() && kills().lock().unwrap_or_else(|e| e.into_inner()).ids.contains(id)
}

/// Starts the reader thread, once per process.
pub fn watch() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let file = match std::fs::File::open("/dev/kmsg") {
            Ok(file) => file,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read /dev/kmsg; OOM kills are known only from the runtime");
                return;
            }
        };
        let spawned = std::thread::Builder::new().name("kmsg".into()).spawn(move || read(file));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the /dev/kmsg reader");
        }
    });
}

fn read(mut file: std::fs::File) {
    // Each read returns one record (at most about 8 KiB).
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                if let Some(id) = killed_container(&String::from_utf8_lossy(&buffer[..n])) {
                    remember(id);
                }
            }
            // Records overwritten before they were read: go on from the next.
            Err(e) if e.raw_os_error() == Some(32) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading /dev/kmsg failed; OOM kills are known only from the runtime");
                return;
            }
        }
    }
}

/// The container id of an `oom-kill:` record: the last component of its
/// `task_memcg` (systemd's `cri-containerd-<id>.scope` unwrapped).
pub fn killed_container(record: &str) -> Option<String> {
    let message = record.split_once(';').map_or(record, |(_, m)| m);
    let fields = message.strip_prefix("oom-kill:")?;
    let memcg = fields.split(',').find_map(|f| f.strip_prefix("task_memcg="))?;
    let last = memcg.trim_end().rsplit('/').next()?;
    let id = last.strip_prefix("cri-containerd-").unwrap_or(last);
    let id = id.strip_suffix(".scope").unwrap_or(id);
    (!id.is_empty()).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_victims_container_is_the_last_component_of_its_memcg() {
        let record = "6,3546,19174100562,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=8e4b,\
                      mems_allowed=0,oom_memcg=/skiff/node-0/burstable/pod87/8e4b12,\
                      task_memcg=/skiff/node-0/burstable/pod87/8e4b12,task=dd,pid=29573,uid=0\n";
        assert_eq!(killed_container(record).as_deref(), Some("8e4b12"));
        let systemd = "6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/kubepods.slice/cri-containerd-abc.scope,task=x,pid=1,uid=0";
        assert_eq!(killed_container(systemd).as_deref(), Some("abc"));
        assert_eq!(killed_container("4,3451,1,-;dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL)"), None);
        assert_eq!(killed_container("6,1,2,-;oom-kill:constraint=CONSTRAINT_NONE,task_memcg=/,task=x"), None);
    }

    #[test]
    fn remembered_kills_are_bounded() {
        for i in 0..REMEMBERED + 10 {
            remember(format!("bounded-{i}"));
        }
        assert!(!killed("bounded-0"), "the oldest are forgotten");
        assert!(killed(&format!("bounded-{}", REMEMBERED + 9)));
        assert!(!killed(""));
    }
}
