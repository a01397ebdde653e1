//! Real-process start-up failures: each is refused with a non-zero exit and
//! one line on stderr for the operator, and leaves nothing on disk destroyed
//! or in the way of a corrected retry.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use support::*;

const IDENTITY_FILE: &str = "skiff-member.json";

/// A scratch cluster whose only member (1) is stopped again, so that its
/// root can host members that are expected not to start.
async fn scratch_cluster() -> Cluster {
    let mut cluster = Cluster::spawn(1).await;
    cluster.kill(1);
    cluster
}

/// Asserts the process failed and printed exactly one line starting with
/// `prefix` that contains `needle`; returns that line.
#[track_caller]
fn one_line_error(out: &Output, prefix: &str, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure, got {}\nstderr: {err}", out.status);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(lines.len(), 1, "expected exactly one {prefix:?} line on stderr:\n{err}");
    assert!(lines[0].contains(needle), "{:?} does not contain {needle:?}\nstderr:\n{err}", lines[0]);
    lines[0].to_string()
}

/// A refusal by `skiff` itself: the last line of stderr is `skiff: ...`.
#[track_caller]
fn refused(out: &Output, needle: &str) -> String {
    let line = one_line_error(out, "skiff: ", needle);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().rev().find(|l| !l.trim().is_empty()), Some(line.as_str()), "{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    eprintln!("refused as expected: {line}");
    line
}

/// A flag rejected by the argument parser (clap exits with status 2).
#[track_caller]
fn bad_flag(out: &Output, needle: &str) -> String {
    let line = one_line_error(out, "error: ", needle);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("rejected as expected: {line}");
    line
}

/// Every file under `dir` with its contents, to prove nothing was touched.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.insert(path.strip_prefix(base).unwrap().to_path_buf(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Polls `etcdctl member list` through `endpoint` until `done` holds.
async fn wait_for_members(cluster: &Cluster, endpoint: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let out = stdout(&cluster.etcdctl(endpoint, &["member", "list"]));
        if done(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what}: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cluster id member `id` puts in its response headers.
async fn cluster_id(cluster: &Cluster, id: u64) -> u64 {
    let s = cluster.status(&cluster.members[&id].client).await.unwrap();
    s.header.unwrap().cluster_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_to_an_unreachable_cluster_fails_naming_it_and_a_retry_joins() {
    let mut cluster = Cluster::spawn(3).await;
    cluster.add_member(4);
    let out = cluster.run_to_exit(4, &["--join", "127.0.0.1:1", "--join-timeout", "2s"]);
    let line = refused(&out, "127.0.0.1:1");
    assert!(line.contains("join failed"), "{line}");
    assert!(line.contains("cannot reach"), "{line}");
    // The running cluster never heard of member 4.
    let join = cluster.members[&1].client.clone();
    let out = must_succeed(cluster.etcdctl(&join, &["member", "list"]));
    assert_eq!(out.lines().count(), 3, "{out}");

    // The same member, on the same data dir, now joins the real cluster.
    cluster.start_with(4, &["--join", &join, "--join-timeout", "30s"]);
    let out = wait_for_members(&cluster, &join, "member 4 never joined as a voter", |out| {
        out.lines().count() == 4 && out.lines().filter(|l| l.contains("false")).count() == 4 && out.contains("member-4")
    })
    .await;
    assert!(out.contains(&cluster.members[&4].client), "{out}\n{}", cluster.log_of(4));
    must_succeed(cluster.etcdctl(&cluster.members[&4].client, &["put", "after-retry", "ok"]));
    // It took on the cluster's id, not the placeholder of the failed attempt.
    assert_eq!(cluster_id(&cluster, 4).await, cluster_id(&cluster, 1).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_identity_file_is_refused_and_left_untouched() {
    let mut cluster = Cluster::spawn(1).await;
    must_succeed(cluster.etcdctl(&cluster.members[&1].client, &["put", "precious", "data"]));
    cluster.kill(1);
    let dir = cluster.members[&1].data_dir.clone();
    let garbage = b"\x00{not json at all\xff".to_vec();
    std::fs::write(dir.join(IDENTITY_FILE), &garbage).unwrap();
    let before = snapshot(&dir);

    let initial = cluster.initial.clone();
    let out = cluster.run_to_exit(1, &["--initial-cluster", &initial]);
    let line = refused(&out, "corrupt");
    assert!(line.contains(IDENTITY_FILE), "{line}");
    assert_eq!(std::fs::read(dir.join(IDENTITY_FILE)).unwrap(), garbage);
    assert!(snapshot(&dir) == before, "the data dir changed after the refusal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_member_1_started_as_member_2_is_refused() {
    let mut cluster = Cluster::spawn(1).await;
    must_succeed(cluster.etcdctl(&cluster.members[&1].client, &["put", "precious", "data"]));
    cluster.kill(1);
    let dir = cluster.members[&1].data_dir.clone();
    let before = snapshot(&dir);

    cluster.add_member(2);
    cluster.members.get_mut(&2).unwrap().data_dir = dir.clone();
    let initial = format!("2={}", cluster.members[&2].peer);
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial]);
    let line = refused(&out, "belongs to member 1");
    assert!(line.contains("not member 2"), "{line}");
    assert!(snapshot(&dir) == before, "the data dir changed after the refusal");

    // Member 1 still starts on it with its data.
    cluster.start(1);
    cluster.must_leader().await;
    let out = must_succeed(cluster.etcdctl(&cluster.members[&1].client, &["get", "precious"]));
    assert!(out.contains("data"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_are_refused_with_a_one_line_error() {
    let mut cluster = scratch_cluster().await;
    cluster.add_member(2);
    let dir = cluster.members[&2].data_dir.clone();

    let out = cluster.run_to_exit(2, &["--initial-cluster", "1=nohost"]);
    bad_flag(&out, "needs a port");
    let out = cluster.run_to_exit(2, &["--initial-cluster", "0=127.0.0.1:1"]);
    bad_flag(&out, "member id 0 is reserved");
    let initial = format!("2={}", cluster.members[&2].peer);
    let out = cluster.run_to_exit(
        2,
        &["--initial-cluster", &initial, "--election-timeout-min", "300ms", "--election-timeout-max", "400ms"],
    );
    refused(&out, "at least 2x wide");
    assert!(!dir.exists(), "a refused configuration created the data dir");

    // Security files that do not load: refused before the store opens.
    let missing = cluster.root.path().join("missing.crt");
    let missing = missing.to_str().unwrap();
    let out = cluster.run_to_exit(
        2,
        &["--initial-cluster", &initial, "--tls-cert-file", missing, "--tls-private-key-file", missing],
    );
    refused(&out, &format!("the HTTP listener's TLS: {missing}: No such file"));
    let peer_tls = ["--peer-cert-file", missing, "--peer-key-file", missing, "--peer-trusted-ca-file", missing];
    let out = cluster.run_to_exit(2, &[&["--initial-cluster", &initial][..], &peer_tls].concat());
    refused(&out, &format!("the peer listener's TLS: {missing}: No such file"));
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--peer-cert-file", missing]);
    bad_flag(&out, "the following required arguments were not provided");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peer-trusted-ca-file"), "{out:?}");
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--trusted-ca-file", missing]);
    bad_flag(&out, "the following required arguments were not provided");
    let tokens = cluster.root.path().join("tokens.csv");
    std::fs::write(&tokens, "s3cret,alice\n").unwrap();
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--token-auth-file", tokens.to_str().unwrap()]);
    refused(&out, "tokens.csv: line 1: needs at least token,user,uid");
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--client-ca-file", missing]);
    bad_flag(&out, "the following required arguments were not provided");
    assert!(String::from_utf8_lossy(&out.stderr).contains("  --tls-cert-file <TLS_CERT_FILE>"), "{out:?}");
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--authorization-mode", "Node"]);
    bad_flag(&out, "unknown authorization mode \"Node\": expected RBAC or AlwaysAllow");
    let policy = cluster.root.path().join("audit-policy.yaml");
    std::fs::write(&policy, "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n").unwrap();
    let log = cluster.root.path().join("audit.log");
    let (policy, log) = (policy.to_str().unwrap(), log.to_str().unwrap());
    let out = cluster
        .run_to_exit(2, &["--initial-cluster", &initial, "--audit-log-path", log, "--audit-policy-file", policy]);
    let line = refused(&out, "the audit log: ");
    assert!(line.contains("audit-policy.yaml") && line.contains("unknown variant `Loud`"), "{line}");
    let encryption = cluster.root.path().join("encryption.yaml");
    std::fs::write(
        &encryption,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - {name: k1, secret: c2hvcnQ=}\n",
    )
    .unwrap();
    let encryption = encryption.to_str().unwrap();
    let out = cluster.run_to_exit(2, &["--initial-cluster", &initial, "--encryption-provider-config", encryption]);
    let line = refused(&out, "--encryption-provider-config: ");
    assert!(line.contains("aesgcm.keys[0].secret: 5 bytes; AES-GCM keys here are 16 or 32 bytes"), "{line}");
    let not_a_key = cluster.root.path().join("sa.key");
    std::fs::write(&not_a_key, "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n").unwrap();
    let out = cluster.run_to_exit(
        2,
        &["--initial-cluster", &initial, "--service-account-signing-key-file", not_a_key.to_str().unwrap()],
    );
    let line = refused(&out, "--service-account-signing-key-file: ");
    assert!(line.contains("sa.key"), "{line}");
    assert!(!dir.exists(), "a refused configuration created the data dir");

    // A fresh data dir with neither --initial-cluster nor --join.
    let out = cluster.run_to_exit(2, &[]);
    refused(&out, "a fresh data dir needs --initial-cluster or --join");
    // That attempt does not stand in the way of a correct start.
    cluster.start_with(2, &["--initial-cluster", &initial]);
    assert_eq!(cluster.must_leader().await, 2, "{}", cluster.log_of(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_joining_under_its_old_id_is_refused() {
    let mut cluster = Cluster::spawn(3).await;
    let join = cluster.members[&1].client.clone();
    wait_for_members(&cluster, &join, "member 3 never published itself", |out| out.contains("member-3")).await;
    cluster.kill(3);
    cluster.wipe(3);

    // With the cluster's TLS flags, so that the join reaches the cluster.
    let mut args = vec!["--join".to_string(), join.clone(), "--join-timeout".into(), "10s".into()];
    args.extend(cluster.extra_args.iter().cloned());
    let out = cluster.run_to_exit(3, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let line = refused(&out, "already exists");
    assert!(line.contains("member 3"), "{line}");

    // The cluster is unharmed: still three members, still writable.
    let out = must_succeed(cluster.etcdctl(&join, &["member", "list"]));
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("member-3"), "{out}");
    must_succeed(cluster.etcdctl(&cluster.endpoints(), &["put", "after-refusal", "ok"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_missing_cluster_flags_does_not_pin_cluster_id_zero() {
    let mut cluster = Cluster::spawn(1).await;
    let founded = cluster_id(&cluster, 1).await;
    assert_ne!(founded, 0);
    cluster.kill(1);
    cluster.wipe(1);

    let out = cluster.run_to_exit(1, &[]);
    refused(&out, "a fresh data dir needs --initial-cluster or --join");
    assert!(!cluster.members[&1].data_dir.exists(), "a refused start leaves no data dir behind");
    // The same founding membership must give the same cluster id as before.
    cluster.start(1);
    cluster.must_leader().await;
    assert_eq!(cluster_id(&cluster, 1).await, founded, "{}", cluster.log_of(1));
}
