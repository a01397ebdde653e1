//! `skiffctl` against a real cluster: kv, history, status, members, compact.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skiffctl_reads_history_status_and_members() {
    let cluster = Cluster::spawn(3).await;
    // The first server is down: skiffctl moves on to the next one.
    let servers = format!("127.0.0.1:1,{}", cluster.endpoints());
    for v in ["one", "two", "three"] {
        must_succeed(cluster.skiffctl(&servers, &["kv", "put", "/app/config", v]));
    }
    must_succeed(cluster.skiffctl(&servers, &["kv", "del", "/app/config"]));
    must_succeed(cluster.skiffctl(&servers, &["kv", "put", "/app/config", "four"]));
    let out = must_succeed(cluster.skiffctl(&servers, &["kv", "history", "/app/config"]));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(rows[0].contains("PUT") && rows[0].ends_with("one"), "{out}");
    assert!(rows[3].contains("DELETE"), "{out}");
    assert!(rows[4].ends_with("four") && rows[4].contains("Z"), "commit time shown: {out}");
    let first_rev: i64 = rows[0].split_whitespace().next().unwrap().parse().unwrap();
    let out = must_succeed(cluster.skiffctl(&servers, &["kv", "get", "/app/config", "--rev", &first_rev.to_string()]));
    assert_eq!(out, "/app/config\none\n");

    // Members publish their client URLs through the log shortly after they
    // start; until then status says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = must_succeed(cluster.skiffctl(&servers, &["status"]));
        assert_eq!(out.lines().count(), 4, "{out}");
        if out.matches('*').count() == 1 && !out.contains("not started") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "status never showed one leader: {out}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = must_succeed(cluster.skiffctl(&servers, &["member", "list"]));
    assert_eq!(out.lines().count(), 4, "{out}");

    must_succeed(cluster.skiffctl(&servers, &["compact", &(first_rev + 1).to_string()]));
    let out = cluster.skiffctl(&servers, &["kv", "get", "/app/config", "--rev", &first_rev.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("compacted"));
    let out = must_succeed(cluster.skiffctl(&servers, &["kv", "history", "/app/config"]));
    assert!(out.contains("compacted"), "{out}");
    let out = cluster.skiffctl(&servers, &["member", "remove", "42"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("member not found"));
}
