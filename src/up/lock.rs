//! One `skiff up` per directory: `DIR/up.lock`, locked with `flock` by
//! `skiff up` and held by every process it starts.
//!
//! The lock's file descriptor is inherited by each child (it is not
//! close-on-exec), and an `flock` lock lasts until every process sharing
//! its descriptor has exited. So a second `skiff up` on DIR is refused as
//! long as the first, or any master it started, still runs, and is told
//! who they are (the file lists each process's pid, rewritten at every
//! start), instead of failing later with "address already in use". A lock
//! whose holders are all exiting (a `skiff up` killed a moment ago) is
//! waited for a little instead.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

const LOCK_FILE: &str = "up.lock";

/// How long a lock held only by exiting processes is waited for.
const EXITING_WAIT: Duration = Duration::from_secs(10);

/// `DIR/up.lock`, locked by this `skiff up`.
#[derive(Debug)]
pub struct DirLock {
    /// Held open for as long as `skiff up` runs: closing it would release
    /// the lock (the children's copies would keep it only while they run).
    file: File,
    path: PathBuf,
}

/// A process holding the lock, as the file lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub label: String,
    pub pid: u32,
}

impl DirLock {
    /// Locks DIR, or says which processes of another `skiff up` hold it.
    /// Holders that are all exiting (a `skiff up` killed a moment ago,
    /// its processes going down with it) are waited for, up to
    /// [`EXITING_WAIT`].
    pub async fn take(dir: &Path) -> Result<DirLock, String> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let deadline = Instant::now() + EXITING_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let running: Vec<Holder> = parse(&text).into_iter().filter(|h| running(h.pid)).collect();
                    if !running.is_empty() || Instant::now() >= deadline {
                        return Err(in_use(dir, &running));
                    }
                    tokio::time::sleep(EXITING_WAIT / 50).await;
                }
                Err(TryLockError::Error(e)) => return Err(format!("cannot lock {}: {e}", path.display())),
            }
        }
        // Not close-on-exec: every process started from now on holds the
        // lock too, so that it outlives a `skiff up` killed before its
        // processes (see the module doc).
        rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty())
            .map_err(|e| format!("{}: cannot pass the lock on to the processes: {e}", path.display()))?;
        let lock = DirLock { file, path };
        lock.record(&[Holder { label: "skiff up".into(), pid: std::process::id() }])
            .map_err(|e| format!("{}: {e}", lock.path.display()))?;
        Ok(lock)
    }

    /// Lists `holders` in the file, for a `skiff up` that finds DIR locked.
    pub fn record(&self, holders: &[Holder]) -> io::Result<()> {
        let text: String = holders.iter().map(|h| format!("{} {}\n", h.label, h.pid)).collect();
        self.file.set_len(0)?;
        self.file.write_all_at(text.as_bytes(), 0)
    }
}

fn parse(text: &str) -> Vec<Holder> {
    text.lines()
        .filter_map(|line| {
            let (label, pid) = line.rsplit_once(' ')?;
            Some(Holder { label: label.to_string(), pid: pid.parse().ok()? })
        })
        .collect()
}

/// Whether `pid` runs and is not exiting. A zombie has exited, though its
/// other threads may still be closing its files (and its lock).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) state ...`; comm may itself hold spaces and parentheses.
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state != "Z")
}

/// The refusal, naming the holders that still run and how to stop them.
fn in_use(dir: &Path, running: &[Holder]) -> String {
    let mut out = format!("{} is in use by another skiff up", dir.display());
    if running.is_empty() {
        out += &format!(" whose processes have not exited within {EXITING_WAIT:?}");
        return out;
    }
    let names: Vec<String> = running.iter().map(|h| format!("{} (pid {})", h.label, h.pid)).collect();
    out += &format!(", still running: {}. ", names.join(", "));
    match running.iter().find(|h| h.label == "skiff up") {
        Some(up) => out += &format!("Stop it first (Ctrl-C where it runs, or kill {})", up.pid),
        None => {
            let pids: Vec<String> = running.iter().map(|h| h.pid.to_string()).collect();
            out += &format!("Stop them first (kill {})", pids.join(" "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_locked_dir_is_refused_naming_the_running_holders() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::take(dir.path()).await.unwrap();
        let gone = u32::MAX / 2; // above any pid_max
        lock.record(&[
            Holder { label: "skiff up".into(), pid: std::process::id() },
            Holder { label: "master-1".into(), pid: gone },
        ])
        .unwrap();
        // Another open file description: flock refuses it as it would
        // another process.
        let err = DirLock::take(dir.path()).await.unwrap_err();
        assert!(err.contains("in use by another skiff up"), "{err}");
        assert!(err.contains(&format!("skiff up (pid {})", std::process::id())), "{err}");
        assert!(err.contains(&format!("kill {}", std::process::id())), "{err}");
        assert!(!err.contains("master-1"), "a holder that has exited is not named: {err}");
        drop(lock);
        DirLock::take(dir.path()).await.expect("the lock is free once its holder has closed it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_whose_holders_are_all_exiting_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::take(dir.path()).await.unwrap();
        let gone = u32::MAX / 2; // above any pid_max
        lock.record(&[Holder { label: "skiff up".into(), pid: gone }]).unwrap();
        let second = DirLock::take(dir.path());
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(EXITING_WAIT / 2, &mut second).await.is_err(),
            "gave up before the holders had time to exit"
        );
        drop(lock);
        second.await.expect("taken once the last holder has closed it");

        let lock = DirLock::take(dir.path()).await.unwrap();
        lock.record(&[Holder { label: "skiff up".into(), pid: gone }]).unwrap();
        let err = DirLock::take(dir.path()).await.unwrap_err();
        assert!(err.contains("have not exited within 10s"), "{err}");
    }

    #[test]
    fn the_holders_are_read_back_with_spaces_in_their_labels() {
        let text = "skiff up 10\nmaster-1 11\ngarbage\n";
        assert_eq!(
            parse(text),
            [Holder { label: "skiff up".into(), pid: 10 }, Holder { label: "master-1".into(), pid: 11 }]
        );
    }
}
