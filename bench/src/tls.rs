//! `--tls`: the cluster as `skiff up` runs it, TLS on every port with
//! authentication and RBAC, so the figures include the handshakes and the
//! per-request checks.
//!
//! A CA made in the run's directory issues the serving certificate, one
//! peer certificate the members share, an administrator's certificate
//! (`system:masters`, for the etcd API: the leader's status) and the
//! measuring user's, `bench`, who holds `cluster-admin` through a
//! ClusterRoleBinding, so every request of the measurement goes through
//! RBAC's rule evaluation rather than the masters' shortcut.
//!
//! The harness's clients read the choice from one process-wide setting
//! ([`set`]), made once before the cluster starts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use skiff_pki::{ClientFiles, Profile, DEFAULT_VALIDITY};

/// The user the measurements run as.
pub const USER: &str = "bench";

/// What the harness's clients present and trust.
pub struct Tls {
    pub pki: PathBuf,
    /// The resource API's connections, as [`USER`].
    pub user: skiff_pki::Connector,
    /// etcd-client's (status, catch-up markers), as an administrator.
    pub etcd: etcd_client::TlsOptions,
}

static TLS: OnceLock<Tls> = OnceLock::new();

/// The process's TLS setting, if `--tls` made one.
pub fn get() -> Option<&'static Tls> {
    TLS.get()
}

/// Makes the PKI in `dir/pki` and the process's TLS setting; returns the
/// flags every member takes.
pub fn set(dir: &Path) -> Result<Vec<String>> {
    let pki = dir.join("pki");
    let names = ["127.0.0.1".to_string(), "localhost".to_string()];
    let ca = skiff_pki::issue_member_certificates(&pki, "skiff-bench-ca", &names).context("the bench CA")?;
    let issue = |profile: Profile, stem: &str| -> Result<()> {
        ca.issue(&profile, DEFAULT_VALIDITY)?.write(&pki, stem)?;
        Ok(())
    };
    issue(Profile::Client { user: "admin".into(), groups: vec![skiff_pki::MASTERS_GROUP.into()] }, "admin")?;
    issue(Profile::Client { user: USER.into(), groups: vec![] }, USER)?;
    let file = |name: &str| pki.join(name);
    let connector = |stem: &str| -> Result<skiff_pki::Connector> {
        let files = ClientFiles {
            ca: file("ca.crt"),
            cert: Some((file(&format!("{stem}.crt")), file(&format!("{stem}.key")))),
        };
        Ok(skiff_pki::Connector::new(Arc::new(skiff_pki::transport::client_config(&files)?)))
    };
    let read = |name: &str| std::fs::read_to_string(file(name)).with_context(|| name.to_string());
    let etcd = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")?))
        .identity(etcd_client::Identity::from_pem(read("admin.crt")?, read("admin.key")?));
    let tls = Tls { pki: pki.clone(), user: connector(USER)?, etcd };
    if TLS.set(tls).is_err() {
        anyhow::bail!("--tls is set once per process");
    }
    Ok(skiff_pki::member_tls_flags(&pki, "peer")
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
        .collect())
}

/// etcd's flags for the same as [`set`] gives Skiff: the serving
/// certificate with client certificates checked, and mutual TLS between
/// peers (the members' URLs are https then; see `cluster.rs`). Empty
/// without `--tls`.
pub fn etcd_flags() -> Vec<String> {
    let Some(tls) = get() else { return Vec::new() };
    let path = |name: &str| tls.pki.join(name).display().to_string();
    let mut flags = vec!["--client-cert-auth".to_string(), "--peer-client-cert-auth".to_string()];
    for (flag, name) in [
        ("--cert-file", "apiserver.crt"),
        ("--key-file", "apiserver.key"),
        ("--trusted-ca-file", "ca.crt"),
        ("--peer-cert-file", "peer.crt"),
        ("--peer-key-file", "peer.key"),
        ("--peer-trusted-ca-file", "ca.crt"),
    ] {
        flags.extend([flag.to_string(), path(name)]);
    }
    flags
}

/// A Skiff resource API client for `endpoints`: over TLS as [`USER`] when
/// `--tls` is on, in plaintext otherwise.
pub fn skiff_client<S: AsRef<str>>(endpoints: &[S]) -> Result<skiff_client::Client> {
    Ok(skiff_client::Client::connect(endpoints, None, get().map(|t| t.user.clone()))?)
}

/// Binds [`USER`] to `cluster-admin` (as an administrator) and waits until
/// RBAC lets it list pods on every member.
pub async fn bind_user(endpoints: &[String]) -> Result<()> {
    let Some(tls) = get() else { return Ok(()) };
    let files =
        ClientFiles { ca: tls.pki.join("ca.crt"), cert: Some((tls.pki.join("admin.crt"), tls.pki.join("admin.key"))) };
    let admin = skiff_pki::Connector::new(Arc::new(skiff_pki::transport::client_config(&files)?));
    let admin = skiff_client::Client::connect(endpoints, None, Some(admin))?;
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "bench-cluster-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    });
    let info = skiff_api::resources::by_plural(Some("rbac.authorization.k8s.io"), "clusterrolebindings")
        .context("the ClusterRoleBinding resource")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match admin.create(info, "", &binding).await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() > deadline => return Err(e).context("binding the bench user"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
    let pods = skiff_api::resources::of(skiff_api::resources::Kind::Pod);
    for endpoint in endpoints {
        let client = skiff_client(&[endpoint])?;
        loop {
            match client.list(pods, "default", &skiff_client::resources::ListParams::default()).await {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("{USER} on {endpoint}"))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}
