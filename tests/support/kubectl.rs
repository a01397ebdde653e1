//! The real kubectl against a test cluster's REST address: each call with
//! a fresh `--cache-dir`, so discovery is never stale between tests.

use std::process::{Command, Output, Stdio};

pub fn kubectl(server: &str, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .args(["--server", &format!("http://{server}"), "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .output()
        .expect("kubectl is installed (make test installs what is missing)")
}

pub fn kubectl_stdin(server: &str, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new("kubectl")
        .args(["--server", &format!("http://{server}"), "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[track_caller]
pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "kubectl failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
pub fn fails(o: Output) -> String {
    assert!(!o.status.success(), "kubectl should have failed: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}
