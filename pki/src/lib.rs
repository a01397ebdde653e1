//! Skiff's cluster PKI: one certificate authority per cluster, the
//! certificates it issues, and the rustls configuration a listener serves
//! with.
//!
//! The layout of a PKI directory follows kubeadm's `/etc/kubernetes/pki`:
//! `ca.crt` and `ca.key` for the authority, then `<name>.crt` and
//! `<name>.key` for each certificate it issued (`apiserver` for the
//! masters' serving certificate, `admin` for the cluster's first user).
//! Keys are ECDSA P-256 (what kubeadm issues by default today) and are
//! written readable by their owner only.
//!
//! Identities follow Kubernetes: a client certificate's common name is the
//! user, each organization a group (`O=system:masters` is the cluster's
//! administrators).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub mod token;
pub mod transport;
pub use transport::{ClientFiles, Connector, PEERS_GROUP};

/// How long the cluster's authority is valid (kubeadm: 10 years).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long an issued certificate is valid unless asked otherwise
/// (kubeadm: 1 year).
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate's validity starts, so a peer whose clock is
/// a little behind does not see it as not yet valid.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The group whose members may do anything (Kubernetes' `system:masters`).
pub const MASTERS_GROUP: &str = "system:masters";
/// The user `skiff up` writes into its kubeconfig.
pub const ADMIN_USER: &str = "skiff-admin";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io { path: path.to_path_buf(), source }
}

fn invalid(what: impl Into<String>, message: impl std::fmt::Display) -> PkiError {
    PkiError::Invalid { what: what.into(), message: message.to_string() }
}

/// What a certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Profile {
    /// A listener's certificate: each name is a DNS name or an IP address
    /// the listener is reached at.
    Server { names: Vec<String> },
    /// A client's: the user and the groups it belongs to.
    Client { user: String, groups: Vec<String> },
    /// A Raft peer's, which it both serves and dials with: reached at
    /// `names`, named `user` in [`PEERS_GROUP`].
    Peer { user: String, names: Vec<String> },
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key` (the key 0600).
    pub fn write(&self, dir: &Path, stem: &str) -> Result<(), PkiError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        write_file(&dir.join(format!("{stem}.crt")), self.cert_pem.as_bytes(), 0o644)?;
        write_file(&dir.join(format!("{stem}.key")), self.key_pem.as_bytes(), 0o600)
    }
}

/// Writes a public file (a CA certificate, 0644) as [`Issued::write`] does.
pub fn write_public(path: &Path, contents: &str) -> Result<(), PkiError> {
    write_file(path, contents.as_bytes(), 0o644)
}

/// Writes a secret file (a key, a configuration holding keys), 0600.
pub fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
    write_file(path, contents.as_bytes(), 0o600)
}

/// Writes through a temporary file and a rename, so a reader never sees
/// half a certificate, with the given mode from the start.
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f =
        fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp).map_err(io(&tmp))?;
    f.write_all(contents).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// The key service account tokens are signed with (kubeadm's `sa.key`):
/// `<dir>/sa.key`, made there first if missing. Every master signs and
/// verifies with the same key. Returns its path.
pub fn load_or_create_signing_key(dir: &Path) -> Result<PathBuf, PkiError> {
    let path = dir.join("sa.key");
    if !path.exists() {
        fs::create_dir_all(dir).map_err(io(dir))?;
        write_file(&path, KeyPair::generate()?.serialize_pem().as_bytes(), 0o600)?;
    }
    Ok(path)
}

/// A PEM private key (ECDSA P-256, PKCS#8: `openssl genpkey -algorithm EC
/// -pkeyopt ec_paramgen_curve:P-256` or `skiff up`) as PKCS#8 DER, the form
/// ring signs with.
pub fn signing_key_der(path: &Path) -> Result<Vec<u8>, PkiError> {
    let pem = fs::read_to_string(path).map_err(io(path))?;
    let key = KeyPair::from_pem(&pem).map_err(|e| invalid(path.display().to_string(), e))?;
    if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(invalid(
            path.display().to_string(),
            "not an ECDSA P-256 key (ES256 is what tokens are signed with)",
        ));
    }
    Ok(key.serialize_der())
}

/// The cluster's certificate authority.
pub struct Authority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + valid_for;
}

impl Authority {
    /// A new self-signed authority named `name`.
    pub fn generate(name: &str) -> Result<Authority, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        validity(&mut params, CA_VALIDITY);
        let cert_pem = params.self_signed(&key)?.pem();
        let key_pem = key.serialize_pem();
        Ok(Authority { cert_pem, key_pem, issuer: Issuer::new(params, key) })
    }

    /// The authority whose certificate and key these are.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Authority, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| invalid("the CA key", e))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| invalid("the CA certificate", e))?;
        Ok(Authority { cert_pem: cert_pem.to_string(), key_pem: key_pem.to_string(), issuer })
    }

    /// Reads `<dir>/ca.crt` and `<dir>/ca.key`.
    pub fn load(dir: &Path) -> Result<Authority, PkiError> {
        Authority::from_files(&dir.join("ca.crt"), &dir.join("ca.key"))
    }

    /// Reads the authority's certificate and key (PEM) from their files.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Authority, PkiError> {
        let read = |path: &Path| fs::read_to_string(path).map_err(io(path));
        Authority::from_pem(&read(cert)?, &read(key)?)
    }

    /// The authority in `dir`, made there first if `dir` has none.
    pub fn load_or_create(dir: &Path, name: &str) -> Result<Authority, PkiError> {
        if dir.join("ca.crt").exists() {
            return Authority::load(dir);
        }
        let ca = Authority::generate(name)?;
        Issued { cert_pem: ca.cert_pem.clone(), key_pem: ca.key_pem.clone() }.write(dir, "ca")?;
        Ok(ca)
    }

    /// The authority's certificate, PEM: what clients and listeners trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A new key and a certificate for it, signed by this authority.
    pub fn issue(&self, profile: &Profile, valid_for: Duration) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let cert = params(profile, valid_for)?.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// A certificate for the key of a certificate signing request (PEM)
    /// whose signature holds, as `profile` says: the request proves its
    /// sender holds the key, and nothing else it asks for is taken (the
    /// subject, names and usages are the signer's choice).
    pub fn sign_request(&self, csr_pem: &str, profile: &Profile, valid_for: Duration) -> Result<String, PkiError> {
        let request = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| invalid("the certificate signing request", e))?;
        let signed = rcgen::CertificateSigningRequestParams { params: params(profile, valid_for)?, ..request };
        Ok(signed.signed_by(&self.issuer)?.pem())
    }
}

/// A new private key and a certificate signing request for it, both PEM:
/// what a joining node sends (the request) and keeps (the key). The
/// request names `user`, which the signer may ignore.
pub fn signing_request(user: &str) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, user);
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((key.serialize_pem(), csr))
}

/// The certificate parameters of `profile`, valid for `valid_for` from now.
fn params(profile: &Profile, valid_for: Duration) -> Result<CertificateParams, PkiError> {
    let mut params = match profile {
        Profile::Server { names } => {
            if names.is_empty() {
                return Err(invalid("a server certificate", "needs at least one name or address"));
            }
            let mut p = CertificateParams::new(names.clone())?;
            p.distinguished_name = DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, names[0].as_str());
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            p
        }
        Profile::Client { user, groups } => {
            if user.is_empty() {
                return Err(invalid("a client certificate", "needs a user name"));
            }
            // rcgen's subject holds one value per attribute type, so
            // one organization: certificates with several groups come
            // from other tools (read by [`identity`] all the same).
            if groups.len() > 1 {
                return Err(invalid("a client certificate", "Skiff issues certificates with one group at most"));
            }
            let mut p = CertificateParams::new(Vec::<String>::new())?;
            p.distinguished_name = DistinguishedName::new();
            for group in groups {
                p.distinguished_name.push(DnType::OrganizationName, group.as_str());
            }
            p.distinguished_name.push(DnType::CommonName, user.as_str());
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            p
        }
        Profile::Peer { user, names } => {
            if names.is_empty() || user.is_empty() {
                return Err(invalid("a peer certificate", "needs a name and at least one address"));
            }
            let mut p = CertificateParams::new(names.clone())?;
            p.distinguished_name = DistinguishedName::new();
            p.distinguished_name.push(DnType::OrganizationName, PEERS_GROUP);
            p.distinguished_name.push(DnType::CommonName, user.as_str());
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            p
        }
    };
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, valid_for);
    Ok(params)
}

/// Who a verified client certificate says its holder is: the common name
/// is the user, each organization a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The identity in a certificate's subject (DER). Only call this on a
/// certificate the TLS handshake verified.
pub fn identity(der: &[u8]) -> Result<Identity, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| invalid("a client certificate", e))?;
    let subject = cert.subject();
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| a.as_str().map(str::to_string);
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|a| text(a).ok())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| invalid("a client certificate", "its subject has no common name"))?;
    let groups = subject.iter_organization().filter_map(|a| text(a).ok()).collect();
    Ok(Identity { user, groups })
}

/// Who the first certificate in `cert_pem` names, and until when (Unix
/// seconds) it is valid: what a node checks of the certificate it kept.
pub fn describe(cert_pem: &str) -> Result<(Identity, i64), PkiError> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| invalid("a certificate", e))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| invalid("a certificate", e))?;
    Ok((identity(&der)?, cert.validity().not_after.timestamp()))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let pem = fs::read(path).map_err(io(path))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path.display().to_string(), e))?;
    if certs.is_empty() {
        return Err(invalid(path.display().to_string(), "holds no PEM certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PkiError> {
    let pem = fs::read(path).map_err(io(path))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| invalid(path.display().to_string(), e))
}

/// The files a TLS listener serves with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    /// The listener's certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// The authorities whose client certificates are accepted; without
    /// one, clients are not asked for a certificate.
    pub client_ca: Option<PathBuf>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls configuration for a listener speaking HTTP/2 and HTTP/1.1.
/// Client certificates are asked for but optional (a client may still
/// authenticate with a token); one that is presented must chain to the
/// client CA, or the handshake fails.
pub fn server_config(files: &ServerFiles) -> Result<ServerConfig, PkiError> {
    let chain = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots.add(cert).map_err(|e| invalid(ca.display().to_string(), e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| invalid(ca.display().to_string(), e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Issues into `dir`, under its CA (made as `ca_name` if `dir` has none),
/// the certificates a cluster's members share: the serving one
/// (`apiserver`, for the client and HTTP listeners) and the peer one
/// (`peer`), both naming `hosts`. Returns the CA, for the users'
/// certificates. How the test and benchmark harnesses lay out a cluster;
/// `skiff up` issues each member a peer certificate of its own.
pub fn issue_member_certificates(dir: &Path, ca_name: &str, hosts: &[String]) -> Result<Authority, PkiError> {
    let ca = Authority::load_or_create(dir, ca_name)?;
    ca.issue(&Profile::Server { names: hosts.to_vec() }, DEFAULT_VALIDITY)?.write(dir, "apiserver")?;
    ca.issue(&Profile::Peer { user: "member".into(), names: hosts.to_vec() }, DEFAULT_VALIDITY)?.write(dir, "peer")?;
    Ok(ca)
}

/// The `skiff apiserver` flags that turn TLS on for every listener, from
/// a PKI directory laid out as this crate lays it out: the serving
/// certificate `apiserver` on the client and HTTP listeners, each checking
/// client certificates against `ca.crt`, and the peer certificate `PEER`
/// on the peer listener, its peers checked against the same CA.
pub fn member_tls_flags(dir: &Path, peer: &str) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("--cert-file", dir.join("apiserver.crt")),
        ("--key-file", dir.join("apiserver.key")),
        ("--trusted-ca-file", dir.join("ca.crt")),
        ("--tls-cert-file", dir.join("apiserver.crt")),
        ("--tls-private-key-file", dir.join("apiserver.key")),
        ("--client-ca-file", dir.join("ca.crt")),
        ("--peer-cert-file", dir.join(format!("{peer}.crt"))),
        ("--peer-key-file", dir.join(format!("{peer}.key"))),
        ("--peer-trusted-ca-file", dir.join("ca.crt")),
    ]
}

/// A kubeconfig for `user` (whose certificate is `issued`) at `server`
/// (`https://HOST:PORT`), trusting `ca_pem`, with everything inline, as
/// kubeadm's `admin.conf`. The context, cluster and user are all `skiff`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, issued: &Issued) -> String {
    kubeconfig_for(&[("skiff", server)], ca_pem, user, issued)
}

/// [`kubeconfig`] with one context per `(name, server)`, the first current.
pub fn kubeconfig_for(contexts: &[(&str, &str)], ca_pem: &str, user: &str, issued: &Issued) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    // JSON strings are valid YAML scalars, so names and addresses are
    // quoted safely whatever they hold.
    let q = |s: &str| format!("{s:?}");
    let mut out = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (name, server) in contexts {
        out += &format!(
            "- name: {}\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n",
            q(name),
            q(server),
            b64(ca_pem)
        );
    }
    out += "contexts:\n";
    for (name, _) in contexts {
        out += &format!("- name: {}\n  context:\n    cluster: {}\n    user: {}\n", q(name), q(name), q(user));
    }
    out += &format!("current-context: {}\n", q(contexts.first().map_or("skiff", |c| c.0)));
    out += &format!(
        "users:\n- name: {}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\npreferences: {{}}\n",
        q(user),
        b64(&issued.cert_pem),
        b64(&issued.key_pem)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_client_certificate_carries_its_user_and_groups() {
        let ca = Authority::generate("test-ca").unwrap();
        let issued =
            ca.issue(&Profile::Client { user: "alice".into(), groups: names(&["dev"]) }, DEFAULT_VALIDITY).unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        assert_eq!(identity(&der).unwrap(), Identity { user: "alice".into(), groups: names(&["dev"]) });
        let two = ca.issue(&Profile::Client { user: "alice".into(), groups: names(&["dev", "ops"]) }, DEFAULT_VALIDITY);
        assert!(two.is_err(), "a second group would be dropped silently; it is refused instead");
    }

    #[test]
    fn nameless_certificates_are_refused_before_signing() {
        let ca = Authority::generate("test-ca").unwrap();
        assert!(ca.issue(&Profile::Client { user: String::new(), groups: vec![] }, DEFAULT_VALIDITY).is_err());
        assert!(ca.issue(&Profile::Server { names: vec![] }, DEFAULT_VALIDITY).is_err());
    }

    #[test]
    fn an_authority_survives_a_trip_through_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let made = Authority::load_or_create(dir.path(), "test-ca").unwrap();
        let again = Authority::load_or_create(dir.path(), "test-ca").unwrap();
        assert_eq!(made.cert_pem(), again.cert_pem(), "an existing authority is kept, not replaced");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join("ca.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the CA key is its owner's only");
        // What the reloaded authority signs verifies against the original
        // certificate: a listener configured with both accepts it.
        let server = again.issue(&Profile::Server { names: names(&["127.0.0.1", "localhost"]) }, DEFAULT_VALIDITY);
        server.unwrap().write(dir.path(), "apiserver").unwrap();
        let files = ServerFiles {
            cert: dir.path().join("apiserver.crt"),
            key: dir.path().join("apiserver.key"),
            client_ca: Some(dir.path().join("ca.crt")),
        };
        server_config(&files).unwrap();
    }

    #[test]
    fn handshakes_check_the_chain_both_ways() {
        use rustls::{ClientConfig, ClientConnection, ServerConnection};
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::load_or_create(dir.path(), "test-ca").unwrap();
        ca.issue(&Profile::Server { names: names(&["127.0.0.1"]) }, DEFAULT_VALIDITY)
            .unwrap()
            .write(dir.path(), "server")
            .unwrap();
        let files = ServerFiles {
            cert: dir.path().join("server.crt"),
            key: dir.path().join("server.key"),
            client_ca: Some(dir.path().join("ca.crt")),
        };
        let server = Arc::new(server_config(&files).unwrap());
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap()).unwrap();
        let client = |cert: Option<&Issued>| {
            let b = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone());
            Arc::new(match cert {
                Some(c) => b
                    .with_client_auth_cert(
                        vec![CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()],
                        PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
                    )
                    .unwrap(),
                None => b.with_no_client_auth(),
            })
        };
        // Runs a handshake in memory; the client identity the server saw.
        let handshake = |config: Arc<ClientConfig>| -> Result<Option<Identity>, rustls::Error> {
            let mut c = ClientConnection::new(config, "127.0.0.1".try_into().unwrap())?;
            let mut s = ServerConnection::new(server.clone())?;
            for _ in 0..10 {
                let mut buf = Vec::new();
                c.write_tls(&mut buf).unwrap();
                s.read_tls(&mut buf.as_slice()).unwrap();
                s.process_new_packets()?;
                let mut buf = Vec::new();
                s.write_tls(&mut buf).unwrap();
                c.read_tls(&mut buf.as_slice()).unwrap();
                c.process_new_packets()?;
                if !c.is_handshaking() && !s.is_handshaking() {
                    return Ok(s.peer_certificates().map(|chain| identity(&chain[0]).unwrap()));
                }
            }
            panic!("the handshake did not finish");
        };
        let alice = ca.issue(&Profile::Client { user: "alice".into(), groups: names(&["dev"]) }, DEFAULT_VALIDITY);
        let seen = handshake(client(Some(&alice.unwrap()))).unwrap();
        assert_eq!(seen, Some(Identity { user: "alice".into(), groups: names(&["dev"]) }));
        assert_eq!(handshake(client(None)).unwrap(), None, "a client may come without a certificate");
        let stranger = Authority::generate("another-ca").unwrap();
        let forged = stranger
            .issue(&Profile::Client { user: "admin".into(), groups: names(&[MASTERS_GROUP]) }, DEFAULT_VALIDITY);
        assert!(handshake(client(Some(&forged.unwrap()))).is_err(), "another authority's certificate is refused");
        let expired = ca.issue(&Profile::Client { user: "bob".into(), groups: vec![] }, Duration::ZERO);
        // Valid from an hour ago until now: expired by the time it is checked.
        std::thread::sleep(Duration::from_millis(1100));
        assert!(handshake(client(Some(&expired.unwrap()))).is_err(), "an expired certificate is refused");
    }
}
