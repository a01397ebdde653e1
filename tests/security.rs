//! The HTTPS listener with authentication on, through real clients: a
//! CA and certificates made by `skiffctl certs`, `skiff apiserver` serving
//! with them, kubectl signing in with a client certificate and with a
//! bearer token, and curl showing what anyone else gets (401, a refused
//! handshake), while the probes stay open; the serving certificate
//! rotated under a running watch.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::kubectl::{fails, ok};
use support::*;

fn skiffctl(args: &[&str]) -> String {
    must_succeed(Command::new(skiffctl_path()).args(args).output().unwrap())
}

fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache.path())
        .args(args)
        .output()
        .expect("kubectl is installed (make test installs what is missing)")
}

/// curl's HTTP status and body, or its exit code when no HTTP happened
/// (a refused handshake).
fn curl(args: &[&str]) -> Result<(u16, String), i32> {
    let o = Command::new("curl").args(["-s", "--max-time", "10", "-w", "\n%{http_code}"]).args(args).output().unwrap();
    if !o.status.success() {
        return Err(o.status.code().unwrap_or(-1));
    }
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap();
    Ok((code.parse().unwrap(), body.to_string()))
}

#[tokio::test(flavor = "multi_thread")]
async fn https_lets_in_certificates_and_tokens_of_the_cluster_and_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let pki_s = pki.to_str().unwrap();
    assert!(skiffctl(&["certs", "ca", "--dir", pki_s]).contains("created a new certificate authority"));
    assert!(skiffctl(&["certs", "ca", "--dir", pki_s]).contains("kept the existing"));
    skiffctl(&["certs", "server", "--dir", pki_s, "--host", "127.0.0.1", "--host", "localhost"]);
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "# token,user,uid,groups\ns3cret-bob,bob,1001,\"ops,oncall\"\n").unwrap();
    let file = |name: &str| pki.join(name).display().to_string();
    let cluster = Cluster::spawn_with(
        1,
        &[
            "--tls-cert-file",
            &file("apiserver.crt"),
            "--tls-private-key-file",
            &file("apiserver.key"),
            "--client-ca-file",
            &file("ca.crt"),
            "--token-auth-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    let http = cluster.members[&1].http.clone();
    let url = format!("https://{http}");

    // A user's certificate and kubeconfig, from skiffctl alone.
    let alice = dir.path().join("alice.kubeconfig");
    skiffctl(&[
        "certs",
        "client",
        "--dir",
        pki_s,
        "--user",
        "alice",
        "--group",
        "dev",
        "--kubeconfig",
        alice.to_str().unwrap(),
        "--server-url",
        &url,
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = kubectl_with(&alice, &["get", "ns", "-o", "name"]);
        if String::from_utf8_lossy(&o.stdout).contains("namespace/default") {
            break;
        }
        assert!(Instant::now() < deadline, "kubectl never listed namespaces: {}", String::from_utf8_lossy(&o.stderr));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let whoami = ok(kubectl_with(&alice, &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"]));
    let who: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(who["username"], "alice", "{whoami}");
    assert_eq!(who["groups"], serde_json::json!(["dev", "system:authenticated"]), "{whoami}");
    ok(kubectl_with(&alice, &["create", "configmap", "over-tls", "--from-literal=k=v"]));
    assert_eq!(ok(kubectl_with(&alice, &["get", "configmap", "over-tls", "-o", "jsonpath={.data.k}"])), "v");

    // A bearer token from the token file, over the same TLS.
    let ca = file("ca.crt");
    let by_token = |token: &str, args: &[&str]| {
        let cache = tempfile::tempdir().unwrap();
        Command::new("kubectl")
            .args(["--server", &url, "--certificate-authority", &ca, "--token", token, "--cache-dir"])
            .arg(cache.path())
            .args(args)
            .output()
            .unwrap()
    };
    let bob = ok(by_token("s3cret-bob", &["auth", "whoami", "-o", "jsonpath={.status.userInfo}"]));
    let who: serde_json::Value = serde_json::from_str(&bob).unwrap();
    assert_eq!(who["username"], "bob");
    assert_eq!(who["groups"], serde_json::json!(["ops", "oncall", "system:authenticated"]));
    let refused = fails(by_token("a-guess", &["get", "ns"]));
    // kubectl's words for a 401 (discovery fails first, so the Status's
    // own message is not what it quotes).
    assert!(refused.contains("error: You must be logged in to the server"), "{refused}");

    // Anyone else: the probes and the version, and a 401 for the rest.
    assert_eq!(curl(&["--cacert", &ca, &format!("{url}/healthz")]), Ok((200, "ok".into())));
    assert_eq!(curl(&["--cacert", &ca, &format!("{url}/readyz")]), Ok((200, "ok".into())));
    let (code, version) = curl(&["--cacert", &ca, &format!("{url}/version")]).unwrap();
    assert_eq!(code, 200, "{version}");
    for path in ["/api/v1/namespaces", "/api", "/openapi/v3", "/metrics"] {
        let (code, body) = curl(&["--cacert", &ca, &format!("{url}{path}")]).unwrap();
        assert_eq!(code, 401, "{path}: {body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status["kind"].as_str(), status["reason"].as_str()), (Some("Status"), Some("Unauthorized")));
    }
    let (code, _) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &file("alice.crt"),
        "--key",
        &file("alice.key"),
        &format!("{url}/api/v1/namespaces/default"),
    ])
    .unwrap();
    assert_eq!(code, 200, "curl with alice's certificate");

    // A certificate of another authority claiming to be an admin: the
    // handshake fails before any HTTP is read. Plain HTTP gets nothing.
    let other = dir.path().join("other");
    let other_s = other.to_str().unwrap();
    skiffctl(&["certs", "ca", "--dir", other_s]);
    skiffctl(&["certs", "client", "--dir", other_s, "--user", "mallory", "--group", "system:masters"]);
    let forged = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &other.join("mallory.crt").display().to_string(),
        "--key",
        &other.join("mallory.key").display().to_string(),
        &format!("{url}/api/v1/namespaces"),
    ]);
    assert!(forged.is_err(), "a stranger's certificate got an answer: {forged:?}");
    assert!(curl(&[&format!("http://{http}/api/v1/namespaces")]).map_or(true, |(code, _)| code != 200));
    // And the server is still there for the legitimate user.
    ok(kubectl_with(&alice, &["get", "configmap", "over-tls"]));

    // Rotation: a new serving certificate is picked up without a restart,
    // and a watch opened before it keeps streaming.
    let watch_out = dir.path().join("watch.out");
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&alice)
        .args(["get", "configmaps", "-w", "-o", "name"])
        .stdout(std::fs::File::create(&watch_out).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let fingerprint = |script: String| {
        let o =
            Command::new("sh").args(["-c", &format!("{script} | openssl x509 -noout -fingerprint -sha256")]).output();
        String::from_utf8_lossy(&o.unwrap().stdout).trim().to_string()
    };
    let served = || fingerprint(format!("openssl s_client -connect {http} </dev/null 2>/dev/null"));
    let old = served();
    assert_eq!(old, fingerprint(format!("cat {}", file("apiserver.crt"))), "the listener serves apiserver.crt");
    skiffctl(&["certs", "server", "--dir", pki_s, "--host", "127.0.0.1"]);
    let new = fingerprint(format!("cat {}", file("apiserver.crt")));
    assert_ne!(old, new);
    let deadline = Instant::now() + Duration::from_secs(30);
    while served() != new {
        assert!(Instant::now() < deadline, "the rotated certificate was never served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ok(kubectl_with(&alice, &["create", "configmap", "after-rotation"]));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&watch_out).unwrap().contains("configmap/after-rotation") {
        assert!(Instant::now() < deadline, "the watch opened before the rotation stopped streaming");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn skiffctl_certs_explain_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = Command::new(skiffctl_path()).args(["certs", "client", "--dir", d, "--user", "alice"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("skiffctl certs ca --dir"), "{err}");
    skiffctl(&["certs", "ca", "--dir", d]);
    let o = Command::new(skiffctl_path()).args(["certs", "client", "--dir", d, "--user", ""]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a user name"), "{o:?}");
}
