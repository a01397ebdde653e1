//! The HTTPS listener with authentication on, through real clients: a
//! CA and certificates made by `skiffctl certs`, `skiff apiserver` serving
//! with them, kubectl signing in with a client certificate and with a
//! bearer token, and curl showing what anyone else gets (401, a refused
//! handshake), while the probes stay open; the serving certificate
//! rotated under a running watch. Then RBAC as kubectl users meet it
//! (bindings, Forbidden, `auth can-i`, aggregation, escalation), the audit
//! log (with PodSecurity's audit annotations), the per-user in-flight
//! limits, and service account tokens from `kubectl create token` and
//! legacy token Secrets. Then mutual TLS between Raft peers and client
//! certificates on the gRPC client port, peer certificates and their CA
//! rotated on running members, NodeRestriction, join tokens, a pod's
//! projected token (also through `skiffctl --token-file`) under the Node
//! authorizer, a master joining with a token, and ResourceQuota under 20
//! concurrent kubectl creates.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::kubectl::{fails, ok};
use support::pki::connector;
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

/// A CA, a serving certificate and a token file made in `dir`, and one
/// member serving HTTPS with them (RBAC on, as it is by default with
/// authentication). Returns the member's https URL.
async fn secure_cluster(dir: &Path, tokens: &str, extra: &[&str]) -> (Cluster, String) {
    let pki = dir.join("pki");
    let pki_s = pki.to_str().unwrap();
    assert!(skiffctl(&["certs", "ca", "--dir", pki_s]).contains("created a new certificate authority"));
    assert!(skiffctl(&["certs", "ca", "--dir", pki_s]).contains("kept the existing"));
    skiffctl(&["certs", "server", "--dir", pki_s, "--host", "127.0.0.1", "--host", "localhost"]);
    let token_file = dir.join("tokens.csv");
    std::fs::write(&token_file, tokens).unwrap();
    let file = |name: &str| pki.join(name).display().to_string();
    let (cert, key, ca) = (file("apiserver.crt"), file("apiserver.key"), file("ca.crt"));
    let mut args = vec![
        "--tls-cert-file",
        &cert,
        "--tls-private-key-file",
        &key,
        "--client-ca-file",
        &ca,
        "--token-auth-file",
        token_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let cluster = Cluster::spawn_plain(1, &args).await;
    let url = format!("https://{}", cluster.members[&1].http);
    (cluster, url)
}

/// kubectl against `url` with a bearer token.
fn kubectl_token(url: &str, ca: &str, token: &str, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .args(["--server", url, "--certificate-authority", ca, "--token", token, "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .output()
        .unwrap()
}

/// Retries `check` for up to 30 s: RBAC follows the store, so a binding
/// is in force a moment after it is written.
async fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn https_lets_in_certificates_and_tokens_of_the_cluster_and_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, url) =
        secure_cluster(dir.path(), "# token,user,uid,groups\ns3cret-bob,bob,1001,\"ops,oncall\"\n", &[]).await;
    let http = cluster.members[&1].http.clone();
    let pki = dir.path().join("pki");
    let pki_s = pki.to_str().unwrap();
    let file = |name: &str| pki.join(name).display().to_string();

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
        "system:masters",
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
    assert_eq!(who["groups"], serde_json::json!(["system:masters", "system:authenticated"]), "{whoami}");
    ok(kubectl_with(&alice, &["create", "configmap", "over-tls", "--from-literal=k=v"]));
    assert_eq!(ok(kubectl_with(&alice, &["get", "configmap", "over-tls", "-o", "jsonpath={.data.k}"])), "v");

    // A bearer token from the token file, over the same TLS.
    let ca = file("ca.crt");
    let by_token = |token: &str, args: &[&str]| kubectl_token(&url, &ca, token, args);
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

/// RBAC through kubectl: the default roles, bindings made with `kubectl
/// create rolebinding`, the Forbidden messages kubectl prints, `kubectl
/// auth can-i`, aggregation extending `view`, and escalation refused.
#[tokio::test(flavor = "multi_thread")]
async fn rbac_lets_each_user_do_what_their_roles_allow_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = "admin-t,root,0,system:masters\nview-t,vera,1\nedit-t,ed,2\nteam-t,tess,3\nnone-t,nobody,4\n";
    let (_cluster, url) = secure_cluster(dir.path(), tokens, &[]).await;
    let ca = dir.path().join("pki/ca.crt").display().to_string();
    let as_user = |token: &str, args: &[&str]| kubectl_token(&url, &ca, token, args);
    let admin = |args: &[&str]| ok(as_user("admin-t", args));
    let forbidden = |token: &str, args: &[&str]| {
        let o = as_user(token, args);
        assert!(!o.status.success(), "{args:?} as {token} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let outcome = |o: Output| {
        if o.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&o.stderr).into_owned())
        }
    };
    eventually("the default roles exist", || outcome(as_user("admin-t", &["get", "clusterrole", "view"]))).await;
    admin(&["create", "namespace", "team"]);
    admin(&["-n", "team", "create", "configmap", "settings", "--from-literal=k=v"]);
    admin(&["-n", "team", "create", "secret", "generic", "password", "--from-literal=p=x"]);
    admin(&["-n", "team", "create", "rolebinding", "viewers", "--clusterrole=view", "--user=vera"]);
    admin(&["-n", "team", "create", "rolebinding", "editors", "--clusterrole=edit", "--user=ed"]);
    admin(&["-n", "team", "create", "rolebinding", "admins", "--clusterrole=admin", "--user=tess"]);
    let wide = admin(&["-n", "team", "get", "rolebindings", "-o", "wide"]);
    assert!(wide.contains("viewers") && wide.contains("ClusterRole/view") && wide.contains("vera"), "{wide}");

    // A user without bindings: discovery and whoami, nothing else.
    let denied = forbidden("none-t", &["-n", "team", "get", "configmaps"]);
    assert!(
        denied.contains(
            "configmaps is forbidden: User \"nobody\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
        "{denied}"
    );
    ok(as_user("none-t", &["auth", "whoami"]));
    ok(as_user("none-t", &["api-resources", "--api-group=apps"]));
    let raw = forbidden("none-t", &["get", "--raw", "/metrics"]);
    assert!(raw.contains("cannot get path \"/metrics\""), "{raw}");

    // view: reads the namespace's objects, not its secrets, writes nothing,
    // and only in the namespace it was bound in.
    eventually("vera reads configmaps", || outcome(as_user("view-t", &["-n", "team", "get", "configmap", "settings"])))
        .await;
    let delete = forbidden("view-t", &["-n", "team", "delete", "configmap", "settings"]);
    assert!(
        delete.contains("Error from server (Forbidden): configmaps \"settings\" is forbidden: User \"vera\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""),
        "{delete}"
    );
    forbidden("view-t", &["-n", "team", "get", "secret", "password"]);
    forbidden("view-t", &["-n", "default", "get", "configmaps"]);
    forbidden("view-t", &["get", "nodes"]);
    assert_eq!(admin(&["-n", "team", "get", "configmap", "settings", "-o", "jsonpath={.data.k}"]), "v");

    // kubectl auth can-i answers as the requests are decided.
    let can_i = |token: &str, args: &[&str]| {
        let o = as_user(token, &[&["auth", "can-i"][..], args].concat());
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(can_i("view-t", &["list", "configmaps", "-n", "team"]), "yes");
    assert_eq!(can_i("view-t", &["delete", "configmaps", "-n", "team"]), "no");
    assert_eq!(can_i("view-t", &["get", "secrets", "-n", "team"]), "no");
    eventually("ed edits", || {
        let answer = can_i("edit-t", &["delete", "configmaps", "-n", "team"]);
        if answer == "yes" {
            Ok(())
        } else {
            Err(answer)
        }
    })
    .await;
    assert_eq!(can_i("edit-t", &["create", "rolebindings", "-n", "team"]), "no");
    assert_eq!(can_i("admin-t", &["delete", "nodes"]), "yes");
    let list = ok(as_user("view-t", &["auth", "can-i", "--list", "-n", "team"]));
    assert!(list.contains("configmaps") && list.contains("[get list watch]"), "{list}");
    ok(as_user("edit-t", &["-n", "team", "create", "configmap", "by-ed"]));

    // Aggregation: a ClusterRole labelled to aggregate into view extends
    // every binding of view at once.
    forbidden("view-t", &["-n", "team", "get", "secrets"]);
    let reader = dir.path().join("reader.yaml");
    std::fs::write(
        &reader,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: secret-reader\n  labels:\n    rbac.authorization.k8s.io/aggregate-to-view: \"true\"\nrules:\n- apiGroups: [\"\"]\n  resources: [\"secrets\"]\n  verbs: [\"get\", \"list\"]\n",
    )
    .unwrap();
    admin(&["apply", "-f", reader.to_str().unwrap()]);
    eventually("view aggregates secret-reader", || outcome(as_user("view-t", &["-n", "team", "get", "secrets"]))).await;

    // Escalation: a namespace admin may hand out what they hold, not more.
    eventually("tess administers team", || {
        outcome(as_user(
            "team-t",
            &["-n", "team", "create", "rolebinding", "more-viewers", "--clusterrole=view", "--user=nobody"],
        ))
    })
    .await;
    let escalate = forbidden(
        "team-t",
        &["-n", "team", "create", "rolebinding", "grab", "--clusterrole=cluster-admin", "--user=tess"],
    );
    assert!(escalate.contains("is attempting to grant RBAC permissions not currently held"), "{escalate}");
    let role = forbidden("team-t", &["-n", "team", "create", "role", "nodes", "--verb=get", "--resource=nodes"]);
    assert!(role.contains("attempting to grant RBAC permissions not currently held"), "{role}");
    ok(as_user("team-t", &["-n", "team", "create", "role", "cm-reader", "--verb=get", "--resource=configmaps"]));
    // The binding tess could make works for its subject.
    eventually("nobody now views team", || outcome(as_user("none-t", &["-n", "team", "get", "configmaps"]))).await;

    // Deleting the binding takes the rights away again.
    admin(&["-n", "team", "delete", "rolebinding", "viewers"]);
    eventually("vera lost view", || match as_user("view-t", &["-n", "team", "get", "configmaps"]).status.success() {
        true => Err("still allowed".into()),
        false => Ok(()),
    })
    .await;
}

/// The audit log as a policy shapes it, and the fairness limits: a user
/// flooding the API with slow requests gets 429 for the ones over their
/// share while another user is served at once.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_records_requests_and_one_user_cannot_starve_another() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n\
         - level: Metadata\n  resources:\n  - group: \"\"\n    resources: [\"secrets\"]\n\
         - level: RequestResponse\n  verbs: [\"create\"]\n  resources:\n  - group: \"\"\n    resources: [\"configmaps\"]\n\
         - level: None\n  nonResourceURLs: [\"/healthz\", \"/readyz\", \"/livez\"]\n\
         - level: Metadata\n",
    )
    .unwrap();
    let tokens = "admin-t,root,0,system:masters\nflood-t,flood,1\ncalm-t,calm,2\n";
    let extra = [
        "--audit-log-path",
        audit.to_str().unwrap(),
        "--audit-policy-file",
        policy.to_str().unwrap(),
        "--max-requests-inflight-per-user",
        "2",
    ];
    let (cluster, url) = secure_cluster(dir.path(), tokens, &extra).await;
    let ca = dir.path().join("pki/ca.crt").display().to_string();
    let as_user = |token: &str, args: &[&str]| kubectl_token(&url, &ca, token, args);
    eventually("the default roles exist", || {
        match as_user("admin-t", &["get", "clusterrole", "view"]).status.success() {
            true => Ok(()),
            false => Err("not yet".into()),
        }
    })
    .await;
    ok(as_user("admin-t", &["create", "configmap", "audited", "--from-literal=k=v"]));
    ok(as_user("admin-t", &["create", "secret", "generic", "hidden", "--from-literal=p=hunter2"]));
    // PodSecurity's audit mode: the pod is let in, its violations logged.
    ok(as_user("admin-t", &["label", "namespace", "default", "pod-security.kubernetes.io/audit=restricted"]));
    ok(as_user("admin-t", &["run", "audited", "--image=busybox", "--restart=Never"]));
    ok(as_user(
        "admin-t",
        &["create", "clusterrolebinding", "readers", "--clusterrole=view", "--user=flood", "--user=calm"],
    ));
    let _ = curl(&["--cacert", &ca, &format!("{url}/healthz")]);
    // The gRPC resource API is audited too (its client port is plaintext
    // here, so its callers are the unsecured client port's user).
    let client = cluster.members[&1].client.clone();
    assert!(skiffctl(&["--server", &client, "get", "configmap", "audited"]).contains("audited"));
    skiffctl(&["--server", &client, "delete", "secret", "hidden"]);
    // And so is the etcd API: a put, and a read of a future revision (OutOfRange).
    assert!(cluster.etcdctl(&client, &["put", "audited-key", "v"]).status.success());
    let future = cluster.etcdctl(&client, &["get", "audited-key", "--rev=999999999"]);
    assert!(String::from_utf8_lossy(&future.stderr).contains("future revision"), "{future:?}");

    // flood: three requests that each wait ~3 s for a revision that never
    // comes; with a share of 2, the third is refused after its queue wait.
    let slow = format!(
        "{url}/api/v1/namespaces/default/configmaps?resourceVersion=999999999&resourceVersionMatch=NotOlderThan"
    );
    let list = format!("{url}/api/v1/namespaces/default/configmaps");
    eventually("the readers binding is in force", || {
        match curl(&["--cacert", &ca, "-H", "Authorization: Bearer calm-t", &list]) {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let floods: Vec<_> = (0..3)
        .map(|_| {
            Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "--cacert",
                    &ca,
                    "-H",
                    "Authorization: Bearer flood-t",
                    &slow,
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile, calm is served at once.
    let started = Instant::now();
    assert_eq!(curl(&["--cacert", &ca, "-H", "Authorization: Bearer calm-t", &list]).map(|r| r.0), Ok(200));
    let calm_took = started.elapsed();
    let mut codes: Vec<String> = floods
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
        .collect();
    codes.sort();
    assert_eq!(codes, ["429", "504", "504"], "flood's three requests");
    assert!(calm_took < Duration::from_secs(2), "calm waited {calm_took:?} behind flood");

    // The log: one JSON event per request, shaped by the policy.
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let text = std::fs::read_to_string(&audit).unwrap();
        let events: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if events.iter().any(|e| e["responseStatus"]["code"] == 429) || Instant::now() > deadline {
            assert!(!text.contains("aGVudGVyMg=="), "a secret's data reached the audit log");
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let find = |verb: &str, resource: &str| {
        events
            .iter()
            .find(|e| e["verb"] == verb && e["objectRef"]["resource"] == resource)
            .unwrap_or_else(|| panic!("no {verb} {resource} event in {events:#?}"))
    };
    let created = find("create", "configmaps");
    assert_eq!(created["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(created["level"], "RequestResponse");
    assert_eq!(created["stage"], "ResponseComplete");
    assert_eq!(created["user"]["username"], "root");
    assert_eq!(created["objectRef"]["namespace"], "default");
    assert_eq!(created["responseStatus"]["code"], 201);
    assert_eq!(created["requestObject"]["data"]["k"], "v");
    assert_eq!(created["responseObject"]["metadata"]["name"], "audited");
    assert_eq!(created["sourceIPs"][0], "127.0.0.1");
    assert!(created["userAgent"].as_str().unwrap().starts_with("kubectl"), "{created}");
    let secret = find("create", "secrets");
    assert_eq!(secret["level"], "Metadata");
    assert!(secret.get("requestObject").is_none() && secret.get("responseObject").is_none(), "{secret}");
    let pod = find("create", "pods");
    assert_eq!(pod["responseStatus"]["code"], 201, "{pod}");
    let annotations = &pod["annotations"];
    assert_eq!(annotations["pod-security.kubernetes.io/enforce-policy"], "privileged:latest", "{pod}");
    let violations = annotations["pod-security.kubernetes.io/audit-violations"].as_str().unwrap_or_default();
    assert!(
        violations.starts_with("would violate PodSecurity \"restricted:latest\": ")
            && violations.contains("runAsNonRoot"),
        "{pod}"
    );
    assert!(secret.get("annotations").is_none(), "only admission annotates: {secret}");
    let refused = events.iter().find(|e| e["responseStatus"]["code"] == 429).expect("the 429 is audited");
    assert_eq!(refused["user"]["username"], "flood");
    assert!(!events.iter().any(|e| e["requestURI"] == "/healthz"), "the policy leaves probes out");
    let over_grpc = |uri: &str| {
        events.iter().find(|e| e["requestURI"] == uri).unwrap_or_else(|| panic!("no {uri} event in {events:#?}"))
    };
    let got = over_grpc("/skiff.resource.Resources/Get");
    assert_eq!(
        (&got["verb"], &got["level"], &got["stage"]),
        (&"get".into(), &"Metadata".into(), &"ResponseComplete".into())
    );
    assert_eq!(got["user"]["username"], "system:unsecured-client-port");
    let object_ref = &got["objectRef"];
    assert_eq!(
        (&object_ref["resource"], &object_ref["namespace"], &object_ref["name"], &object_ref["apiVersion"]),
        (&"configmaps".into(), &"default".into(), &"audited".into(), &"v1".into()),
        "{got}"
    );
    assert_eq!(got["responseStatus"]["code"], 200);
    assert!(got.get("responseObject").is_none(), "Metadata logs no object: {got}");
    let deleted = over_grpc("/skiff.resource.Resources/Delete");
    assert_eq!((&deleted["verb"], &deleted["objectRef"]["name"]), (&"delete".into(), &"hidden".into()), "{deleted}");
    assert_eq!(deleted["responseStatus"]["code"], 200);
    let put = over_grpc("/etcdserverpb.KV/Put");
    assert_eq!(
        (&put["verb"], &put["level"], &put["responseStatus"]["code"]),
        (&"post".into(), &"Metadata".into(), &200.into())
    );
    assert_eq!(put["user"]["username"], "system:unsecured-client-port");
    assert!(put.get("objectRef").is_none() && put["userAgent"].as_str().is_some_and(|a| a.contains("grpc")), "{put}");
    let ranges: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["requestURI"] == "/etcdserverpb.KV/Range").collect();
    assert!(
        ranges.iter().any(|e| e["responseStatus"]["code"] == 410),
        "the future revision is OutOfRange: {ranges:#?}"
    );
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

#[tokio::test(flavor = "multi_thread")]
async fn a_service_account_token_works_until_its_pod_or_account_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let key = skiff_pki::load_or_create_signing_key(&dir.path().join("sa")).unwrap();
    let extra = ["--service-account-signing-key-file", key.to_str().unwrap()];
    let (_cluster, url) = secure_cluster(dir.path(), "admin-t,root,0,system:masters\n", &extra).await;
    let ca = dir.path().join("pki/ca.crt").display().to_string();
    let admin = |args: &[&str]| kubectl_token(&url, &ca, "admin-t", args);
    eventually("the default roles exist", || match admin(&["get", "clusterrole", "view"]).status.success() {
        true => Ok(()),
        false => Err("not yet".into()),
    })
    .await;
    ok(admin(&["create", "serviceaccount", "robot"]));
    // No controller manager runs here to make `default`, which pods
    // without an account are admitted with.
    ok(admin(&["create", "serviceaccount", "default"]));
    let overrides = r#"{"spec": {"serviceAccountName": "robot"}}"#;
    ok(admin(&["run", "web", "--image=busybox", "--restart=Never", "--overrides", overrides]));
    ok(admin(&["run", "other", "--image=busybox", "--restart=Never"]));

    // A token bound to the pod: the service account's identity, nothing more.
    let bound = ["create", "token", "robot", "--bound-object-kind", "Pod", "--bound-object-name", "web"];
    let token = ok(admin(&bound)).trim().to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let as_robot = |args: &[&str]| kubectl_token(&url, &ca, &token, args);
    let who = ok(as_robot(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]));
    assert_eq!(who, "system:serviceaccount:default:robot");
    let groups = ok(as_robot(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}"]));
    assert!(groups.contains("system:serviceaccounts:default") && groups.contains("system:authenticated"), "{groups}");
    let denied = fails(as_robot(&["get", "secrets"]));
    assert!(
        denied.contains("User \"system:serviceaccount:default:robot\" cannot list resource \"secrets\""),
        "{denied}"
    );
    ok(admin(&["create", "rolebinding", "robot-view", "--clusterrole=view", "--serviceaccount=default:robot"]));
    eventually("the binding is in force", || match as_robot(&["get", "pods", "-o", "name"]).status.success() {
        true => Ok(()),
        false => Err("not yet".into()),
    })
    .await;

    // Bad requests: another pod's service account, a pod that is not there, too short.
    let err = fails(admin(&["create", "token", "robot", "--bound-object-kind", "Pod", "--bound-object-name", "other"]));
    assert!(
        err.contains(
            "cannot bind token for serviceaccount \"robot\" to pod running with different serviceaccount name"
        ),
        "{err}"
    );
    let err = fails(admin(&["create", "token", "robot", "--bound-object-kind", "Pod", "--bound-object-name", "ghost"]));
    assert!(err.contains("pods \"ghost\" not found"), "{err}");
    let err = fails(admin(&["create", "token", "robot", "--duration", "1m"]));
    assert!(err.contains("may not specify a duration less than 10 minutes"), "{err}");
    // A token signed with another key, and an altered one, are strangers.
    let mut parts: Vec<&str> = token.split('.').collect();
    parts[2] = "AAAA";
    let forged = parts.join(".");
    let err = fails(kubectl_token(&url, &ca, &forged, &["auth", "whoami"]));
    assert!(err.contains("Unauthorized"), "{err}");

    // Deleting the pod revokes its token; an unbound token lives on until
    // the service account goes.
    let unbound = ok(admin(&["create", "token", "robot"])).trim().to_string();
    ok(admin(&["delete", "pod", "web", "--grace-period=0", "--force"]));
    let err = fails(as_robot(&["auth", "whoami"]));
    assert!(err.contains("Unauthorized"), "{err}");
    let as_unbound = |args: &[&str]| kubectl_token(&url, &ca, &unbound, args);
    assert_eq!(ok(as_unbound(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])), who);

    // A legacy token Secret, asked for as Kubernetes has it: filled with a
    // token of the account that lives as long as the Secret.
    let secret = |name: &str, annotations: &str| {
        let path = dir.path().join(format!("{name}.json"));
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"{name}","annotations":{{{annotations}}}}},
               "type":"kubernetes.io/service-account-token"}}"#
        );
        std::fs::write(&path, body).unwrap();
        admin(&["create", "-f", path.to_str().unwrap()])
    };
    ok(secret("robot-token", r#""kubernetes.io/service-account.name":"robot""#));
    let field = |path: &str| ok(admin(&["get", "secret", "robot-token", "-o", &format!("jsonpath={path}")]));
    let decode = |b64: String| {
        use base64::Engine;
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64.trim()).unwrap()).unwrap()
    };
    assert_eq!(decode(field("{.data.namespace}")), "default");
    let robot_uid = ok(admin(&["get", "serviceaccount", "robot", "-o", "jsonpath={.metadata.uid}"]));
    assert_eq!(field("{.metadata.annotations.kubernetes\\.io/service-account\\.uid}"), robot_uid);
    let legacy = decode(field("{.data.token}"));
    let as_legacy = |args: &[&str]| kubectl_token(&url, &ca, &legacy, args);
    assert_eq!(ok(as_legacy(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])), who);
    let err = fails(secret("nameless-token", ""));
    assert!(err.contains("metadata.annotations[kubernetes.io/service-account.name]: Required value"), "{err}");
    let err = fails(secret("ghost-token", r#""kubernetes.io/service-account.name":"ghost""#));
    assert!(err.contains("serviceaccount \"ghost\" not found"), "{err}");
    ok(admin(&["delete", "secret", "robot-token"]));
    let err = fails(as_legacy(&["auth", "whoami"]));
    assert!(err.contains("Unauthorized"), "{err}");
    ok(admin(&["delete", "serviceaccount", "robot"]));
    let err = fails(as_unbound(&["auth", "whoami"]));
    assert!(err.contains("Unauthorized"), "{err}");
}

/// What a Raft message (an undecodable vote) to the peer listener at
/// `addr` gets, sent over TLS with `tls` or in plaintext. A member that
/// reads it refuses it as InvalidArgument; one that never lets the
/// message in fails the call at the transport.
async fn vote_on(addr: &str, tls: Option<skiff_pki::Connector>) -> tonic::Code {
    use skiff_proto::peer::peer_client::PeerClient;
    use skiff_proto::peer::Payload;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(5));
    let channel = match tls {
        Some(tls) => endpoint.connect_with_connector(tls).await,
        None => endpoint.connect().await,
    };
    let Ok(channel) = channel else { return tonic::Code::Unavailable };
    match PeerClient::new(channel).vote(Payload { data: b"term 1000, vote for me".to_vec() }).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

/// Mutual TLS between Raft peers and client certificates on the client
/// port, through real members and etcdctl: only a peer certificate of
/// the cluster gets a message to Raft, only system:masters uses the etcd
/// API, and a member without a peer certificate cannot join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_peers_reach_raft_or_join_and_only_administrators_the_etcd_api() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cluster_pki(dir.path());
    let p = pki.to_str().unwrap();
    assert!(skiffctl(&["certs", "peer", "--dir", p, "--name", "member", "--host", "127.0.0.1"]).contains("peer-member"));
    skiffctl(&[
        "certs",
        "client",
        "--dir",
        p,
        "--user",
        "system:node:a",
        "--group",
        "system:nodes",
        "--name",
        "node-a",
    ]);
    let file = |name: &str| pki.join(name).display().to_string();
    let client_flags = [
        "--cert-file",
        &file("apiserver.crt"),
        "--key-file",
        &file("apiserver.key"),
        "--trusted-ca-file",
        &file("ca.crt"),
    ]
    .map(String::from);
    let peer_flags = [
        "--peer-cert-file",
        &file("peer-member.crt"),
        "--peer-key-file",
        &file("peer-member.key"),
        "--peer-trusted-ca-file",
        &file("ca.crt"),
    ]
    .map(String::from);
    let flags: Vec<&str> = client_flags.iter().chain(&peer_flags).map(String::as_str).collect();
    let admin = connector(&pki, Some("root"));
    let mut cluster = Cluster::spawn_tls(3, &flags, admin.clone()).await;
    let leader = cluster.must_leader().await;
    let client = cluster.members[&leader].client.clone();
    let term = status_over(&client, Some(&admin)).await.unwrap().raft_term;

    // The etcd API: the admin's certificate, and no one else.
    let endpoint = format!("https://{client}");
    let (ca, root, root_key) = (file("ca.crt"), file("root.crt"), file("root.key"));
    let (node, node_key) = (file("node-a.crt"), file("node-a.key"));
    let as_root = ["--cacert", &ca, "--cert", &root, "--key", &root_key];
    must_succeed(etcdctl(&endpoint, &[&as_root[..], &["put", "k", "v"]].concat(), None));
    let anonymous = etcdctl(&endpoint, &["--cacert", &ca, "get", "k"], None);
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("Unauthenticated"), "{anonymous:?}");
    let as_node = etcdctl(&endpoint, &["--cacert", &ca, "--cert", &node, "--key", &node_key, "get", "k"], None);
    let err = String::from_utf8_lossy(&as_node.stderr);
    assert!(err.contains("PermissionDenied") && err.contains("system:masters only"), "{err}");

    // The peer listener: a peer's message reaches Raft (which finds it
    // undecodable); nobody else's is read at all.
    let peer_addr = cluster.members[&leader].peer.clone();
    assert_eq!(vote_on(&peer_addr, Some(connector(&pki, Some("peer-member")))).await, tonic::Code::InvalidArgument);
    let stranger_dir = dir.path().join("stranger");
    let s = stranger_dir.to_str().unwrap();
    skiffctl(&["certs", "ca", "--dir", s]);
    skiffctl(&["certs", "peer", "--dir", s, "--name", "member", "--host", "127.0.0.1"]);
    for (who, tls) in [
        ("plaintext", None),
        ("no certificate", Some(connector(&pki, None))),
        ("the admin's certificate", Some(connector(&pki, Some("root")))),
        ("another CA's peer certificate", Some(connector(&stranger_dir, Some("peer-member")))),
    ] {
        let code = vote_on(&peer_addr, tls).await;
        assert!(
            !matches!(code, tonic::Code::Ok | tonic::Code::InvalidArgument),
            "{who}: the message got in ({code:?})"
        );
    }
    assert!(cluster.log_of(leader).contains("refused a peer connection"), "{}", cluster.log_of(leader));

    // Joining: without TLS the member cannot even talk to the client
    // port; with a node's certificate in place of a peer's it is refused.
    cluster.add_member(4);
    let plain = cluster.run_to_exit(4, &["--join", &client, "--join-timeout", "3s"]);
    assert!(String::from_utf8_lossy(&plain.stderr).contains("join failed"), "{plain:?}");
    cluster.wipe(4);
    let mut as_node = vec!["--join", &client, "--join-timeout", "3s"];
    as_node.extend(client_flags.iter().map(String::as_str));
    as_node.extend(["--peer-cert-file", &node, "--peer-key-file", &node_key, "--peer-trusted-ca-file", &ca]);
    let refused = cluster.run_to_exit(4, &as_node);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("may not call /skiff.control.Control/Join"), "{err}");

    // The group is as it was: three members, the same leader and term.
    let members = must_succeed(etcdctl(&endpoint, &[&as_root[..], &["member", "list"]].concat(), None));
    assert_eq!(members.lines().count(), 3, "{members}");
    assert_eq!(cluster.must_leader().await, leader);
    assert_eq!(status_over(&client, Some(&admin)).await.unwrap().raft_term, term);
    let got = must_succeed(etcdctl(&endpoint, &[&as_root[..], &["get", "k", "--print-value-only"]].concat(), None));
    assert_eq!(got.trim(), "v");
}

/// Rotating the Raft peers' certificates, and then their CA, on running
/// members without a restart: each member follows its peer files both
/// where it serves Raft and where it dials its peers. First every member
/// trusts the old CA and the new one, then presents a certificate of the
/// new one, then trusts only the new one. A member restarted after that
/// accepts only new certificates, so it catches up only if the others dial
/// it with theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_rotate_their_peer_certificates_and_ca_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, next) = (cluster_pki(dir.path()), dir.path().join("pki-next"));
    let (p, n) = (pki.to_str().unwrap(), next.to_str().unwrap());
    for dir in [p, n] {
        skiffctl(&["certs", "ca", "--dir", dir]);
        skiffctl(&["certs", "peer", "--dir", dir, "--name", "member", "--host", "127.0.0.1"]);
    }
    // What the members read, replaced the safe way (write, then rename).
    let peers = dir.path().join("peers");
    std::fs::create_dir(&peers).unwrap();
    let replace = |name: &str, text: String| {
        let staged = peers.join(format!(".{name}"));
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, peers.join(name)).unwrap();
    };
    let read = |dir: &Path, name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    replace("peer.crt", read(&pki, "peer-member.crt"));
    replace("peer.key", read(&pki, "peer-member.key"));
    replace("trust.crt", read(&pki, "ca.crt"));
    let (file, peer_file) =
        (|name: &str| pki.join(name).display().to_string(), |name: &str| peers.join(name).display().to_string());
    let flags = [
        ("--cert-file", file("apiserver.crt")),
        ("--key-file", file("apiserver.key")),
        ("--trusted-ca-file", file("ca.crt")),
        ("--peer-cert-file", peer_file("peer.crt")),
        ("--peer-key-file", peer_file("peer.key")),
        ("--peer-trusted-ca-file", peer_file("trust.crt")),
    ]
    .map(|(flag, value)| [flag.to_string(), value]);
    let flags: Vec<&str> = flags.iter().flatten().map(String::as_str).collect();
    let admin = connector(&pki, Some("root"));
    let mut cluster = Cluster::spawn_tls(3, &flags, admin.clone()).await;
    let leader = cluster.must_leader().await;
    let (ca, root, root_key) = (file("ca.crt"), file("root.crt"), file("root.key"));
    let as_root = ["--cacert", &ca, "--cert", &root, "--key", &root_key];
    let endpoint = format!("https://{}", cluster.members[&leader].client);
    let put = |key: &str| must_succeed(etcdctl(&endpoint, &[&as_root[..], &["put", key, "v"]].concat(), None));
    put("before");

    // Each step is taken up twice by every member: by its peer listener
    // and by what it dials its peers with.
    let mut reloads = 0;
    let mut rotate = |files: &[(&str, String)]| {
        for (name, text) in files {
            replace(name, text.clone());
        }
        reloads += 2;
        reloads
    };
    let both_cas = format!("{}{}", read(&pki, "ca.crt"), read(&next, "ca.crt"));
    let steps = [
        vec![("trust.crt", both_cas)],
        vec![("peer.key", read(&next, "peer-member.key")), ("peer.crt", read(&next, "peer-member.crt"))],
        vec![("trust.crt", read(&next, "ca.crt"))],
    ];
    for step in steps {
        let expected = rotate(&step);
        eventually("every member takes the rotated files up", || {
            for id in 1..=3 {
                let log = cluster.log_of(id);
                let seen = log.matches("using the rotated certificate").count();
                if seen < expected {
                    return Err(format!("member {id}: {seen} of {expected} reloads"));
                }
            }
            Ok(())
        })
        .await;
        put("during");
    }

    // A follower restarted now trusts only the new CA: the others must
    // dial it with their new certificates for it to catch up.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    cluster.start(follower);
    put("after");
    let leader_revision =
        status_over(&cluster.members[&leader].client, Some(&admin)).await.unwrap().header.unwrap().revision;
    cluster.must_catch_up(follower, leader_revision, Duration::from_secs(30)).await;
    let log = cluster.log_of(follower);
    assert!(!log.contains("refused a peer connection"), "a peer dialed with an old certificate:\n{log}");
}

/// NodeRestriction behind the `system:node` role, as a node's identity
/// meets it through kubectl: a node writes its own Node and the pods bound
/// to it, and nothing of another node's.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_writes_its_own_node_and_pods_and_nothing_of_another_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = "admin-t,root,0,system:masters\nnode-a-t,system:node:a,1,system:nodes\n";
    let (_cluster, url) = secure_cluster(dir.path(), tokens, &[]).await;
    let ca = dir.path().join("pki/ca.crt").display().to_string();
    let admin = |args: &[&str]| ok(kubectl_token(&url, &ca, "admin-t", args));
    let as_node = |args: &[&str]| kubectl_token(&url, &ca, "node-a-t", args);
    let file = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    for node in ["a", "b"] {
        admin(&[
            "create",
            "-f",
            &file(
                &format!("node-{node}.json"),
                format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{node}"}}}}"#),
            ),
        ]);
        admin(&[
            "create",
            "-f",
            &file(
                &format!("pod-{node}.json"),
                format!(
                    r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"on-{node}"}},
               "spec":{{"nodeName":"{node}","containers":[{{"name":"c","image":"busybox"}}]}}}}"#
                ),
            ),
        ]);
    }
    let outcome =
        |o: Output| if o.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&o.stderr).into_owned()) };
    eventually("the node role is bound", || outcome(as_node(&["label", "node", "a", "ready=yes"]))).await;

    let refused = |args: &[&str], why: &str| {
        let err = fails(as_node(args));
        assert!(err.contains("Forbidden") || err.contains("forbidden"), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    refused(&["label", "node", "b", "ready=yes"], "node \"a\" is not allowed to modify node \"b\"");
    let status = ["--subresource=status", "--type=merge", "-p", r#"{"status":{"message":"seen"}}"#];
    ok(as_node(&[&["patch", "pod", "on-a"][..], &status].concat()));
    refused(
        &[&["patch", "pod", "on-b"][..], &status].concat(),
        "can only update pod status for pods with spec.nodeName set to itself",
    );
    refused(&["delete", "pod", "on-b", "--wait=false"], "can only delete pods with spec.nodeName set to itself");
    let pod = file(
        "pod-c.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"mine"},
        "spec":{"nodeName":"a","containers":[{"name":"c","image":"busybox"}]}}"#
            .to_string(),
    );
    refused(&["create", "-f", &pod], "can only create mirror pods");
    assert!(admin(&["get", "node", "b", "--show-labels"]).contains("<none>"), "node b was relabelled");
    assert_eq!(admin(&["get", "pod", "on-a", "-o", "jsonpath={.status.message}"]), "seen");
    ok(as_node(&["delete", "pod", "on-a", "--wait=false"]));
}

/// Join tokens through real processes: `skiffctl token create` against a
/// member with TLS on every port, then `skiff node --token` (with its own
/// containerd). A token whose pin is another CA's stops the node before
/// it asks for anything; the real one gets the node its own certificate,
/// and it registers and turns Ready under it. The token authenticates as
/// its bootstrapper and nothing more, and neither a revoked nor an
/// expired token does at all; the node keeps working with what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_with_a_token_that_pins_the_clusters_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cluster_pki(dir.path());
    let other = dir.path().join("other-pki");
    skiffctl(&["certs", "ca", "--dir", other.to_str().unwrap()]);
    let file = |name: &str| pki.join(name).display().to_string();
    let ca = file("ca.crt");
    let flags = secured_member_flags(&pki);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::spawn_tls(1, &flags, connector(&pki, Some("root"))).await;
    let server = format!("https://{}", cluster.members[&1].client);
    let url = format!("https://{}", cluster.members[&1].http);
    let (root, root_key) = (file("root.crt"), file("root.key"));
    let as_root = ["--server", &server, "--certificate-authority", &ca, "--client-certificate", &root];
    let admin = |args: &[&str]| skiffctl(&[&as_root[..], &["--client-key", &root_key], args].concat());

    let token = admin(&["token", "create", "--ttl", "1h", "--description", "for joined-1"]).trim().to_string();
    assert!(token.starts_with("K10") && token.contains("::"), "{token}");
    let bearer = token.split_once("::").unwrap().1.to_string();
    let id = bearer.split_once('.').unwrap().0.to_string();
    let listed = admin(&["token", "list"]);
    assert!(listed.contains(&id) && listed.contains("for joined-1"), "{listed}");
    assert!(!listed.contains(&bearer), "token list never shows a secret: {listed}");

    // The same token pinning another CA: the node stops before sending it.
    let other_ca = std::fs::read_to_string(other.join("ca.crt")).unwrap();
    let forged = format!("K10{}::{bearer}", skiff_pki::token::ca_hash(&other_ca).unwrap());
    let refused = Command::new(SKIFF)
        .args(["node", "--server", &cluster.endpoints(), "--name", "forged-1", "--token", &forged])
        .arg("--data-dir")
        .arg(dir.path().join("forged-1"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("refusing to send the token"), "{err}");
    assert!(!dir.path().join("forged-1/pki/node.crt").exists());

    // The real token: the node's own certificate, then Ready under it.
    let mut node =
        support::node::NodeAgent::start(dir.path(), &cluster, "joined-1", "10.244.60.0/24", &["--token", &token]);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = Command::new(skiffctl_path())
            .args(as_root)
            .args(["--client-key", &root_key, "get", "node", "joined-1", "-o", "json"])
            .output()
            .unwrap();
        let ready = serde_json::from_slice::<serde_json::Value>(&got.stdout).ok().is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        });
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "joined-1 never turned Ready:\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let kept = std::fs::read_to_string(node.data_dir.join("pki/node.crt")).unwrap();
    let (who, _) = skiff_pki::describe(&kept).unwrap();
    assert_eq!((who.user.as_str(), who.groups.as_slice()), ("system:node:joined-1", &["system:nodes".to_string()][..]));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(node.data_dir.join("pki/node.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the node's key is its own");
    let log = cluster.log_of(1);
    assert!(log.contains("node=joined-1") && log.contains("issued a node certificate"), "{log}");
    assert!(!log.contains("node=forged-1"), "the forged pin's node asked for nothing: {log}");

    // The token is its bootstrapper, who may do nothing else.
    let as_token = |t: &str, args: &[&str]| kubectl_token(&url, &ca, t, args);
    let whoami = ok(as_token(&bearer, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]));
    assert_eq!(whoami, format!("system:bootstrap:{id}"));
    assert!(fails(as_token(&bearer, &["get", "secrets", "-A"])).contains("Forbidden"));

    // Revoked: refused at once, while the node goes on with its certificate,
    // across a restart too.
    assert!(admin(&["token", "delete", &id]).contains("revoked"));
    assert!(fails(as_token(&bearer, &["auth", "whoami"])).contains("Unauthorized"));
    node.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !node.log().contains("registered again") {
        assert!(Instant::now() < deadline, "joined-1 did not come back with its kept certificate:\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Expired: refused likewise.
    let short = admin(&["token", "create", "--ttl", "1s"]).trim().to_string();
    let short = short.split_once("::").unwrap().1.to_string();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(fails(as_token(&short, &["auth", "whoami"])).contains("Unauthorized"));
    node.stop();
}

/// A master joins with a join-master token and no other flag: it checks
/// the cluster's CA against the token's pin, and gets its own serving and
/// peer certificates and the keys every master shares. Then it serves as
/// the first one does: TLS on every port, the Secrets the first member
/// encrypted, the service account tokens it issued, node certificates
/// signed with the cluster's CA. A forged pin sends nothing; a join-node
/// token gets nothing; a restart uses what the master kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_joins_with_a_token_and_serves_with_the_clusters_keys() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cluster_pki(dir.path());
    let p = pki.to_str().unwrap();
    skiffctl(&["certs", "peer", "--dir", p, "--name", "member", "--host", "127.0.0.1"]);
    let file = |name: &str| pki.join(name).display().to_string();
    let sa_key = skiff_pki::load_or_create_signing_key(&pki).unwrap();
    let encryption = dir.path().join("encryption.yaml");
    std::fs::write(
        &encryption,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      \
         - {name: k1, secret: 9n1mC0mJm2y8o6Hq1qYpZk5Q7v3W0cHq3xk0s8LrT1E=}\n",
    )
    .unwrap();
    let mut flags = secured_member_flags(&pki);
    for (flag, value) in [
        ("--peer-cert-file", file("peer-member.crt")),
        ("--peer-key-file", file("peer-member.key")),
        ("--peer-trusted-ca-file", file("ca.crt")),
        ("--service-account-signing-key-file", sa_key.display().to_string()),
        ("--encryption-provider-config", encryption.display().to_string()),
    ] {
        flags.extend([flag.to_string(), value]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let admin_tls = connector(&pki, Some("root"));
    let mut cluster = Cluster::spawn_tls(1, &flags, admin_tls.clone()).await;
    let first = cluster.members[&1].client.clone();
    let url = |cluster: &Cluster, id: u64| format!("https://{}", cluster.members[&id].http);
    let (ca, root, root_key) = (file("ca.crt"), file("root.crt"), file("root.key"));
    let as_root = ["--server", &format!("https://{first}"), "--certificate-authority", &ca];
    let admin = |args: &[&str]| {
        skiffctl(&[&as_root[..], &["--client-certificate", &root, "--client-key", &root_key], args].concat())
    };

    // What the first member made: an encrypted Secret, a token it signed.
    let on_first = url(&cluster, 1);
    ok(kubectl_cert(&on_first, &pki, "root", &["create", "secret", "generic", "s", "--from-literal=k=v"]));
    ok(kubectl_cert(&on_first, &pki, "root", &["create", "serviceaccount", "builder"]));
    let sa_token = ok(kubectl_cert(&on_first, &pki, "root", &["create", "token", "builder"])).trim().to_string();
    let node_token = admin(&["token", "create", "--usages", "join-node"]).trim().to_string();
    let master_token = admin(&["token", "create", "--usages", "join-master", "--ttl", "10m"]).trim().to_string();
    let bearer = master_token.split_once("::").unwrap().1.to_string();

    // A forged pin: nothing is sent, nothing kept.
    cluster.add_member(4);
    let other = dir.path().join("other-pki");
    skiffctl(&["certs", "ca", "--dir", other.to_str().unwrap()]);
    let other_ca = std::fs::read_to_string(other.join("ca.crt")).unwrap();
    let forged = format!("K10{}::{bearer}", skiff_pki::token::ca_hash(&other_ca).unwrap());
    let refused = cluster.run_to_exit(4, &["--join", &first, "--token", &forged]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("refusing to send the token"), "{err}");
    let kept = cluster.members[&4].data_dir.join("pki");
    assert!(!kept.join("peer.crt").exists() && !kept.join("ca.key").exists());
    assert!(!cluster.log_of(1).contains("a master's credentials were asked for"), "{}", cluster.log_of(1));

    // A join-node token is no master's.
    let refused = cluster.run_to_exit(4, &["--join", &first, "--token", &node_token]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("may not join as a master"), "{err}");
    cluster.wipe(4);

    // The real token, and no other flag about TLS or keys.
    cluster.start_alone(4, &["--join", &first, "--token", &master_token]);
    let endpoint = format!("https://{}", cluster.members[&4].client);
    let as_admin = ["--cacert", ca.as_str(), "--cert", &root, "--key", &root_key];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let members = etcdctl(&endpoint, &[&as_admin[..], &["member", "list"]].concat(), None);
        if members.status.success() && String::from_utf8_lossy(&members.stdout).lines().count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "member 4 did not join:\n{}", cluster.log_of(4));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(cluster.must_leader().await, 1);
    let log = cluster.log_of(1);
    assert!(log.contains("handed a joining master the cluster's credentials") && log.contains("member-4"), "{log}");

    // It decrypts what the first member encrypted, and encrypts alike.
    let on_fourth = url(&cluster, 4);
    let k = ok(kubectl_cert(&on_fourth, &pki, "root", &["get", "secret", "s", "-o", "jsonpath={.data.k}"]));
    assert_eq!(k, "dg==", "the Secret's data through the joined master");
    ok(kubectl_cert(&on_fourth, &pki, "root", &["create", "secret", "generic", "t", "--from-literal=k=w"]));
    let stored = must_succeed(etcdctl(
        &format!("https://{first}"),
        &[&as_admin[..], &["get", "/registry/secrets/default/t", "--print-value-only"]].concat(),
        None,
    ));
    assert!(stored.starts_with("k8s:enc:aesgcm:v1:k1:"), "{stored}");
    // It accepts the first member's service account tokens.
    let whoami = ok(kubectl_token(
        &on_fourth,
        &ca,
        &sa_token,
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
    ));
    assert_eq!(whoami, "system:serviceaccount:default:builder");
    // It signs nodes' certificates with the cluster's CA.
    let node_token = skiff_pki::token::JoinToken::parse(&node_token).unwrap();
    let node_dir = dir.path().join("node-n1");
    let node_files = skiff_client::join::NodeFiles::new(&node_dir);
    let fourth = vec![cluster.members[&4].client.clone()];
    skiff_client::join::node_credentials(&fourth, Some(&node_token), "n1", &node_files).await.unwrap();
    let (who, _) = skiff_pki::describe(&std::fs::read_to_string(node_dir.join("node.crt")).unwrap()).unwrap();
    assert_eq!(who.user, "system:node:n1");
    assert!(cluster.log_of(4).contains("issued a node certificate"));
    // What it keeps: the shared keys as they are, private.
    use std::os::unix::fs::PermissionsExt;
    for (kept_name, original) in
        [("ca.key", pki.join("ca.key")), ("sa.key", sa_key.clone()), ("encryption-config.yaml", encryption.clone())]
    {
        let path = kept.join(kept_name);
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(&original).unwrap(), "{kept_name}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "{kept_name}");
    }
    let (peer, _) = skiff_pki::describe(&std::fs::read_to_string(kept.join("peer.crt")).unwrap()).unwrap();
    assert_eq!((peer.user.as_str(), peer.groups.as_slice()), ("member-4", &["system:skiff-peers".to_string()][..]));

    // Revoked, the token is no longer needed: a restart uses what was kept.
    let id = bearer.split_once('.').unwrap().0.to_string();
    assert!(admin(&["token", "delete", &id]).contains("revoked"));
    cluster.stop(4);
    cluster.start_alone(4, &[]);
    let revision = status_over(&first, Some(&admin_tls)).await.unwrap().header.unwrap().revision;
    cluster.must_catch_up(4, revision, Duration::from_secs(30)).await;
    assert!(cluster.log_of(4).contains("using the credentials this master was handed"), "{}", cluster.log_of(4));
    let k = ok(kubectl_cert(&url(&cluster, 4), &pki, "root", &["get", "secret", "t", "-o", "jsonpath={.data.k}"]));
    assert_eq!(k, "dw==");
}

/// A member's flags for TLS on its client and HTTP ports with `pki`'s
/// `apiserver` certificate, client certificates of `pki`'s CA checked on
/// both, and that CA signing nodes' certificates.
fn secured_member_flags(pki: &Path) -> Vec<String> {
    let file = |name: &str| pki.join(name).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("apiserver.crt"), file("apiserver.key"));
    [
        ("--cert-file", &cert),
        ("--key-file", &key),
        ("--trusted-ca-file", &ca),
        ("--tls-cert-file", &cert),
        ("--tls-private-key-file", &key),
        ("--client-ca-file", &ca),
        ("--cluster-signing-cert-file", &ca),
        ("--cluster-signing-key-file", &file("ca.key")),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value.clone()])
    .collect()
}

/// A cluster's PKI in `dir/pki`, made by `skiffctl certs`: the CA, the
/// members' serving certificate for 127.0.0.1, and client certificates for
/// `root` (system:masters) and the controller manager (`cm`).
fn cluster_pki(dir: &Path) -> std::path::PathBuf {
    let pki = dir.join("pki");
    let p = pki.to_str().unwrap();
    skiffctl(&["certs", "ca", "--dir", p]);
    skiffctl(&["certs", "server", "--dir", p, "--host", "127.0.0.1"]);
    skiffctl(&["certs", "client", "--dir", p, "--user", "root", "--group", "system:masters"]);
    skiffctl(&["certs", "client", "--dir", p, "--user", "system:kube-controller-manager", "--name", "cm"]);
    pki
}

/// A component's flags to reach the client port as the holder of
/// `pki/STEM.crt`.
fn client_cert_flags(pki: &Path, stem: &str) -> Vec<String> {
    let file = |name: String| pki.join(name).display().to_string();
    vec![
        "--certificate-authority".to_string(),
        file("ca.crt".into()),
        "--client-certificate".into(),
        file(format!("{stem}.crt")),
        "--client-key".into(),
        file(format!("{stem}.key")),
    ]
}

/// The controller manager, signed in with `pki/cm.crt`.
fn spawn_controller_manager(cluster: &Cluster, pki: &Path) -> support::controllers::Component {
    let flags = client_cert_flags(pki, "cm");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    support::controllers::Component::spawn(cluster, "cm", &flags)
}

/// kubectl against `url` as the holder of `pki/STEM.crt`.
fn kubectl_cert(url: &str, pki: &Path, stem: &str, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let file = |name: &str| pki.join(name).display().to_string();
    Command::new("kubectl")
        .args(["--server", url, "--certificate-authority", &file("ca.crt")])
        .args(["--client-certificate", &file(&format!("{stem}.crt")), "--client-key", &file(&format!("{stem}.key"))])
        .arg("--cache-dir")
        .arg(cache.path())
        .args(args)
        .output()
        .unwrap()
}

/// A pod on a real node over TLS, as the seed's example has it: the
/// ServiceAccount admission gives it the `default` account and the
/// `kube-api-access` volume, the controller manager publishes the CA as
/// `kube-root-ca.crt`, and the node agent fills the volume with a token it
/// asks for bound to the pod. The token signs in as the pod's account and
/// stops working when the pod is deleted. The node, under the Node
/// authorizer, reads the Secret its pod uses and not one of another
/// node's pod, and may list no Secrets at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_its_token_and_its_node_reads_only_what_its_pods_use() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cluster_pki(dir.path());
    let p = pki.to_str().unwrap();
    let node_name = "tokens-1";
    let node_user = format!("system:node:{node_name}");
    skiffctl(&["certs", "client", "--dir", p, "--user", &node_user, "--group", "system:nodes", "--name", "node"]);
    let sa_key = skiff_pki::load_or_create_signing_key(&dir.path().join("sa")).unwrap();
    let mut flags = secured_member_flags(&pki);
    flags.extend(["--service-account-signing-key-file".to_string(), sa_key.display().to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::spawn_tls(1, &flags, connector(&pki, Some("root"))).await;
    let url = format!("https://{}", cluster.members[&1].http);
    let file = |name: &str| pki.join(name).display().to_string();
    let _cm = spawn_controller_manager(&cluster, &pki);
    let node_flags = client_cert_flags(&pki, "node");
    let node_flags: Vec<&str> = node_flags.iter().map(String::as_str).collect();
    let mut node = support::node::NodeAgent::start(dir.path(), &cluster, node_name, "10.244.61.0/24", &node_flags);
    let admin = |args: &[&str]| kubectl_cert(&url, &pki, "root", args);
    let as_node = |args: &[&str]| kubectl_cert(&url, &pki, "node", args);

    // The controller manager makes `default` and publishes the CA.
    eventually("the default account and kube-root-ca.crt", || {
        let o = admin(&["get", "configmap", "kube-root-ca.crt", "-o", "jsonpath={.data.ca\\.crt}"]);
        let published = String::from_utf8_lossy(&o.stdout).into_owned();
        match admin(&["get", "serviceaccount", "default"]).status.success() && !published.is_empty() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
        }
    })
    .await;
    let pod = |name: &str, node: &str, secret: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},
               "spec":{{"nodeName":"{node}","terminationGracePeriodSeconds":1,"containers":[{{"name":"c",
               "image":"skiff.local/busybox:1","command":["sleep","3600"],
               "env":[{{"name":"SECRET","valueFrom":{{"secretKeyRef":{{"name":"{secret}","key":"v"}}}}}}]}}]}}}}"#
        )
    };
    for (name, node, secret) in [("reader", node_name, "mine"), ("elsewhere", "tokens-2", "theirs")] {
        ok(admin(&["create", "secret", "generic", secret, "--from-literal=v=hidden"]));
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, pod(name, node, secret)).unwrap();
        ok(admin(&["create", "-f", path.to_str().unwrap()]));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while ok(admin(&["get", "pod", "reader", "-o", "jsonpath={.status.phase}"])) != "Running" {
        let describe = String::from_utf8_lossy(&admin(&["describe", "pod", "reader"]).stdout).into_owned();
        assert!(
            Instant::now() < deadline,
            "reader never ran:
{describe}
{}",
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let spec =
        ok(admin(&["get", "pod", "reader", "-o", "jsonpath={.spec.serviceAccountName} {.spec.volumes[0].name}"]));
    assert!(spec.starts_with("default kube-api-access-"), "{spec}");

    // What the pod sees, from inside its container.
    let read = |path: &str| {
        ok(admin(&["exec", "reader", "--", "cat", &format!("/var/run/secrets/kubernetes.io/serviceaccount/{path}")]))
    };
    assert_eq!(read("namespace"), "default");
    assert_eq!(read("ca.crt"), std::fs::read_to_string(pki.join("ca.crt")).unwrap());
    let token = read("token");
    let ca = file("ca.crt");
    let whoami =
        ok(kubectl_token(&url, &ca, &token, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]));
    assert_eq!(whoami, "system:serviceaccount:default:default");
    // The same token from a file, over the gRPC resource API (what a
    // component configured with --token-file sends): the account, with
    // only what it was granted.
    let token_file = dir.path().join("pod-token");
    std::fs::write(&token_file, &token).unwrap();
    let server = format!("https://{}", cluster.members[&1].client);
    let as_pod = ["--server", &server, "--certificate-authority", &ca, "--token-file", token_file.to_str().unwrap()];
    let err = skiffctl_err(&[&as_pod[..], &["get", "pod", "reader"]].concat());
    assert!(err.contains("\"system:serviceaccount:default:default\" cannot get resource \"pods\""), "{err}");
    ok(admin(&["create", "rolebinding", "default-view", "--clusterrole=view", "--serviceaccount=default:default"]));
    eventually("the account reads pods with its token", || {
        let o = Command::new(skiffctl_path()).args(as_pod).args(["get", "pod", "reader"]).output().unwrap();
        match o.status.success() && String::from_utf8_lossy(&o.stdout).contains("reader") {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
        }
    })
    .await;

    // The node reads its pod's Secret, not another node's pod's, and lists none.
    ok(as_node(&["get", "secret", "mine"]));
    let err = fails(as_node(&["get", "secret", "theirs"]));
    assert!(err.contains(&format!("no relationship found between node '{node_name}' and this object")), "{err}");
    let err = fails(as_node(&["get", "secrets"]));
    assert!(err.contains("can only get individual resources of this type"), "{err}");
    // Nor tokens for another node's pod.
    let err = fails(as_node(&[
        "create",
        "token",
        "default",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "elsewhere",
    ]));
    assert!(err.contains("requested a token bound to a pod scheduled on a different node"), "{err}");

    // Deleting the pod revokes its token, and the node's reach with it.
    ok(admin(&["delete", "pod", "reader", "--wait=false"]));
    eventually("the token stops working", || {
        match kubectl_token(&url, &ca, &token, &["auth", "whoami"]).status.success() {
            false => Ok(()),
            true => Err("still accepted".into()),
        }
    })
    .await;
    eventually("the node loses the pod's Secret", || match as_node(&["get", "secret", "mine"]).status.success() {
        false => Ok(()),
        true => Err("still readable".into()),
    })
    .await;

    // A legacy token Secret goes with its account (the garbage collector
    // follows the owner reference it was given).
    ok(admin(&["create", "serviceaccount", "robot"]));
    let path = dir.path().join("robot-token.json");
    let secret = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"robot-token",
        "annotations":{"kubernetes.io/service-account.name":"robot"}},"type":"kubernetes.io/service-account-token"}"#;
    std::fs::write(&path, secret).unwrap();
    ok(admin(&["create", "-f", path.to_str().unwrap()]));
    let owner = ok(admin(&["get", "secret", "robot-token", "-o", "jsonpath={.metadata.ownerReferences[0].name}"]));
    assert_eq!(owner, "robot");
    ok(admin(&["delete", "serviceaccount", "robot"]));
    eventually("the token Secret is collected", || match admin(&["get", "secret", "robot-token"]).status.success() {
        false => Ok(()),
        true => Err("still there".into()),
    })
    .await;
    node.stop();
}

fn skiffctl_err(args: &[&str]) -> String {
    let o = Command::new(skiffctl_path()).args(args).output().unwrap();
    assert!(!o.status.success(), "skiffctl {args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// ResourceQuota through real processes over TLS: three members, the
/// controller manager counting usage, and 20 `kubectl create` at once
/// spread over the members' HTTPS ports. The quota's cpu allows 8 of the
/// pods and its count 7: exactly 7 are admitted, whichever members they
/// went through, and the others get Kubernetes' message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_admits_exactly_its_limit_of_20_concurrent_kubectl_creates_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = cluster_pki(dir.path());
    let flags = secured_member_flags(&pki);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::spawn_tls(3, &flags, connector(&pki, Some("root"))).await;
    let file = |name: &str| pki.join(name).display().to_string();
    let _cm = spawn_controller_manager(&cluster, &pki);
    let urls: Vec<String> = (1..=3).map(|id| format!("https://{}", cluster.members[&id].http)).collect();
    let admin = |args: &[&str]| kubectl_cert(&urls[0], &pki, "root", args);

    ok(admin(&["create", "namespace", "quoted"]));
    ok(admin(&["create", "quota", "q", "-n", "quoted", "--hard=pods=7,requests.cpu=2"]));
    eventually("the controller manager counts the quota's usage", || {
        match ok(admin(&["get", "quota", "q", "-n", "quoted", "-o", "jsonpath={.status.used.pods}"])).as_str() {
            "0" => Ok(()),
            other => Err(format!("used pods: {other:?}")),
        }
    })
    .await;

    let creates: Vec<_> = (0..20)
        .map(|i| {
            let path = dir.path().join(format!("p{i}.json"));
            let pod = format!(
                r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p{i}","namespace":"quoted"}},
                   "spec":{{"containers":[{{"name":"c","image":"busybox","resources":{{"requests":{{"cpu":"250m"}}}}}}]}}}}"#
            );
            std::fs::write(&path, pod).unwrap();
            let cache = dir.path().join(format!("kube-cache-{i}"));
            Command::new("kubectl")
                .args(["--server", &urls[i % 3], "--certificate-authority", &file("ca.crt")])
                .args(["--client-certificate", &file("root.crt"), "--client-key", &file("root.key")])
                .arg("--cache-dir")
                .arg(&cache)
                .args(["create", "-f"])
                .arg(&path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut admitted = 0;
    for create in creates {
        let out = create.wait_with_output().unwrap();
        if out.status.success() {
            admitted += 1;
            continue;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is forbidden: exceeded quota: q, requested: pods=1, used: pods=7, limited: pods=7"),
            "{err}"
        );
    }
    assert_eq!(admitted, 7);
    let names = ok(admin(&["get", "pods", "-n", "quoted", "-o", "name"]));
    assert_eq!(names.lines().count(), 7, "{names}");
    let used = ok(admin(&["get", "quota", "q", "-n", "quoted", "-o", "jsonpath={.status.used}"]));
    let used: serde_json::Value = serde_json::from_str(&used).unwrap();
    assert_eq!(used, serde_json::json!({"pods": "7", "requests.cpu": "1750m"}));
}
