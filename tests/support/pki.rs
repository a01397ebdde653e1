//! A cluster's certificates for real-process tests that run the masters as
//! `skiff up` and `deploy/` do: TLS on every listener, mutual TLS between
//! Raft peers, and clients that present certificates.
//!
//! One CA issues the serving certificate every listener presents, the peer
//! certificate the members share (both naming every address a member may
//! be reached at) and an administrator's client certificate (`root`, in
//! `system:masters`), which is what the etcd API and the harness's own
//! calls need.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use skiff_pki::{Authority, ClientFiles, Profile, DEFAULT_VALIDITY, MASTERS_GROUP};

use super::kubectl::{Api, ClientCert};

/// The administrator the harness acts as.
pub const ADMIN: &str = "root";

pub struct Pki {
    pub dir: PathBuf,
    /// Holds `dir` when the PKI made its own directory.
    _temp: Option<tempfile::TempDir>,
}

impl Pki {
    /// A CA and the members' certificates in a directory of its own, for
    /// members reached at `hosts` (IP addresses or names).
    pub fn create(hosts: &[String]) -> Pki {
        let temp = tempfile::tempdir().expect("a directory for the cluster's certificates");
        let mut pki = Pki::create_in(temp.path(), hosts);
        pki._temp = Some(temp);
        pki
    }

    /// [`Pki::create`] in `dir`.
    pub fn create_in(dir: &Path, hosts: &[String]) -> Pki {
        let ca = skiff_pki::issue_member_certificates(dir, "skiff-test-ca", hosts).expect("the members' certificates");
        let admin = Profile::Client { user: ADMIN.into(), groups: vec![MASTERS_GROUP.into()] };
        ca.issue(&admin, DEFAULT_VALIDITY).and_then(|issued| issued.write(dir, ADMIN)).expect(ADMIN);
        Pki { dir: dir.to_path_buf(), _temp: None }
    }

    /// The path of `name` in the PKI's directory.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The flags that turn TLS on for every listener of a member: the
    /// client port checks client certificates, the HTTP port takes them
    /// (and tokens), the peers authenticate each other.
    pub fn member_flags(&self) -> Vec<String> {
        skiff_pki::member_tls_flags(&self.dir, "peer")
            .into_iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
            .collect()
    }

    /// Issues a client certificate for `user` in `groups` as `STEM.crt`
    /// (a component's or a node's identity).
    pub fn issue_client(&self, stem: &str, user: &str, groups: &[&str]) {
        let ca = Authority::load(&self.dir).expect("the test CA");
        let profile = Profile::Client { user: user.into(), groups: groups.iter().map(|g| g.to_string()).collect() };
        ca.issue(&profile, DEFAULT_VALIDITY).and_then(|issued| issued.write(&self.dir, stem)).expect(stem);
    }

    /// The files of the client certificate `STEM.crt` and the CA.
    pub fn client_cert(&self, stem: &str) -> ClientCert {
        ClientCert {
            ca: self.dir.join("ca.crt"),
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        }
    }

    /// A component's flags (`skiff controller-manager`, `scheduler`,
    /// `node`) to reach the client ports as the holder of `STEM.crt`.
    pub fn component_flags(&self, stem: &str) -> Vec<String> {
        self.client_cert(stem).flags()
    }

    /// A gRPC connector that trusts the CA and presents the administrator's
    /// certificate.
    pub fn admin(&self) -> skiff_pki::Connector {
        connector(&self.dir, Some(ADMIN))
    }

    /// etcdctl's flags to reach a member as the administrator.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        vec![
            format!("--cacert={}", self.file("ca.crt")),
            format!("--cert={}", self.file(&format!("{ADMIN}.crt"))),
            format!("--key={}", self.file(&format!("{ADMIN}.key"))),
        ]
    }

    /// The REST API of the member at `addr`, reached as the administrator.
    pub fn api(&self, addr: &str) -> Api {
        Api::secure(addr, self.client_cert(ADMIN))
    }
}

/// A gRPC connector trusting `pki/ca.crt` and presenting `pki/STEM.crt`
/// (nothing without a stem).
pub fn connector(pki: &Path, stem: Option<&str>) -> skiff_pki::Connector {
    let cert = stem.map(|s| (pki.join(format!("{s}.crt")), pki.join(format!("{s}.key"))));
    let files = ClientFiles { ca: pki.join("ca.crt"), cert };
    skiff_pki::Connector::new(Arc::new(
        skiff_pki::transport::client_config(&files).expect("a client TLS configuration"),
    ))
}
