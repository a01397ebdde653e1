//! Processes that end with `skiff up`, even when it is killed with SIGKILL
//! and cannot stop them itself.
//!
//! `skiff up` starts each process with [`PARENT_PID_ENV`] set to its own
//! pid. Such a process calls [`end_with_parent`] first thing in `main`: it
//! asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`),
//! then checks that its parent is still that pid, since a parent that died
//! before the request would never send the signal.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
//! not the process; `skiff up` therefore forks only from its main thread
//! (`on_main_thread` in [`super`] enforces it).

use rustix::process::{getppid, set_parent_process_death_signal, Signal};

/// The environment variable through which `skiff up` passes its pid to
/// the processes it starts.
pub const PARENT_PID_ENV: &str = "SKIFF_UP_PARENT_PID";

/// Makes this process end when the `skiff up` that started it does; does
/// nothing in a process that `skiff up` did not start. An error means the
/// process must exit: its `skiff up` is gone or the request failed.
pub fn end_with_parent() -> Result<(), String> {
    let Some(value) = std::env::var_os(PARENT_PID_ENV) else { return Ok(()) };
    let parent: i32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{PARENT_PID_ENV}={value:?} is not a pid"))?;
    set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("cannot ask to end with skiff up (pid {parent}): {e}"))?;
    // Checked after the request, so that a parent dying at any moment is
    // caught by one or the other.
    match getppid() {
        Some(pid) if pid.as_raw_pid() == parent => Ok(()),
        _ => Err(format!("skiff up (pid {parent}) that started this process has exited")),
    }
}
