//! Join tokens, in k3s's form: `K10<sha256 of the cluster CA>::<id>.<secret>`.
//!
//! The part after `::` is a Kubernetes bootstrap token (`[a-z0-9]{6}` id,
//! `[a-z0-9]{16}` secret), stored as a `bootstrap.kubernetes.io/token`
//! Secret in `kube-system` and sent as a bearer token. The part before it
//! pins the cluster's CA: a joining node fetches the CA over a connection
//! it does not yet trust, hashes it, and sends the secret only over a
//! connection verified against a CA whose hash matches. A man in the
//! middle can serve another CA, but never learns the secret.

use std::fmt;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::{invalid, PkiError};

/// Where a token is stored, as Kubernetes names it: a Secret of this type
/// named [`SECRET_PREFIX`] and its id, in [`NAMESPACE`]. The apiserver
/// reads what `skiffctl token` writes.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const SECRET_PREFIX: &str = "bootstrap-token-";
pub const NAMESPACE: &str = "kube-system";
/// The extra group of tokens made with `--usages join-node`: holders may
/// ask for a node certificate.
pub const JOIN_NODE_GROUP: &str = "system:bootstrappers:skiff:join-node";
/// The extra group of tokens made with `--usages join-master`: holders may
/// have a new master's credentials.
pub const JOIN_MASTER_GROUP: &str = "system:bootstrappers:skiff:join-master";

/// What a full token starts with (k3s's "K10", the version of the format).
pub const PREFIX: &str = "K10";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A parsed join token.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// The hex SHA-256 of the cluster CA's certificate (DER); `None` for a
    /// bare `<id>.<secret>`, which pins nothing.
    pub ca_hash: Option<String>,
    /// The public half: names the token (and its Secret) in lists and logs.
    pub id: String,
    /// The private half.
    pub secret: String,
}

/// The secret never reaches logs through `{:?}`.
impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken").field("ca_hash", &self.ca_hash).field("id", &self.id).finish_non_exhaustive()
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(hash) = &self.ca_hash {
            write!(f, "{PREFIX}{hash}::")?;
        }
        write!(f, "{}.{}", self.id, self.secret)
    }
}

fn random_chars(n: usize) -> Result<String, PkiError> {
    use ring::rand::SecureRandom;
    // 36 letters; bytes >= 252 are drawn again so every letter is as likely.
    let rng = ring::rand::SystemRandom::new();
    let mut out = String::with_capacity(n);
    let mut byte = [0u8; 1];
    while out.len() < n {
        rng.fill(&mut byte).map_err(|_| invalid("a join token", "the system's random source failed"))?;
        if byte[0] < 252 {
            out.push(ALPHABET[(byte[0] % 36) as usize] as char);
        }
    }
    Ok(out)
}

fn is_token_part(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b))
}

impl JoinToken {
    /// A new random token pinning `ca_pem`.
    pub fn generate(ca_pem: &str) -> Result<JoinToken, PkiError> {
        Ok(JoinToken { ca_hash: Some(ca_hash(ca_pem)?), id: random_chars(ID_LEN)?, secret: random_chars(SECRET_LEN)? })
    }

    /// Reads `K10<64 hex>::<id>.<secret>` or a bare `<id>.<secret>`.
    pub fn parse(text: &str) -> Result<JoinToken, PkiError> {
        let text = text.trim();
        let bad = |why: &str| invalid("the join token", why);
        let (ca_hash, bootstrap) = match text.split_once("::") {
            Some((pin, rest)) => {
                let hash = pin
                    .strip_prefix(PREFIX)
                    .ok_or_else(|| bad("expected K10<CA hash>::<id>.<secret> or <id>.<secret>"))?;
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("the CA hash after K10 is not 64 hex digits (a SHA-256)"));
                }
                (Some(hash.to_ascii_lowercase()), rest)
            }
            None => (None, text),
        };
        let (id, secret) = bootstrap.split_once('.').ok_or_else(|| bad("expected <id>.<secret> after the CA hash"))?;
        if !is_token_part(id, ID_LEN) || !is_token_part(secret, SECRET_LEN) {
            return Err(bad("the id is 6 and the secret 16 characters of [a-z0-9]"));
        }
        Ok(JoinToken { ca_hash, id: id.to_string(), secret: secret.to_string() })
    }

    /// Whether `text` has the shape of a bootstrap token's bearer part
    /// (`<id>.<secret>`), so authenticators can skip other tokens cheaply.
    pub fn looks_like_bearer(text: &str) -> bool {
        text.split_once('.').is_some_and(|(id, secret)| is_token_part(id, ID_LEN) && is_token_part(secret, SECRET_LEN))
    }

    /// What is sent as `Authorization: Bearer`: `<id>.<secret>`.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Whether `ca_pem` is the CA this token pins; `Err` says why not, in
    /// words for the operator. A token without a hash pins nothing and
    /// never matches: the caller must trust the CA some other way.
    pub fn check_pin(&self, ca_pem: &str) -> Result<(), PkiError> {
        let Some(want) = &self.ca_hash else {
            return Err(invalid("the join token", "has no CA hash (K10<hash>::) to check the cluster's CA against"));
        };
        let have = ca_hash(ca_pem)?;
        if &have != want {
            return Err(invalid(
                "the cluster's CA",
                format!("its hash is {have}, the token pins {want}: refusing to send the token to this server"),
            ));
        }
        Ok(())
    }
}

/// The hex SHA-256 of the first certificate in `ca_pem` (its DER), what a
/// token pins.
pub fn ca_hash(ca_pem: &str) -> Result<String, PkiError> {
    let der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| invalid("the cluster's CA", e))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether the PEM bundle `bundle` holds the certificate `cert_pem` (its
/// first): a member whose peers trust its signing CA can hand a joining
/// master a peer certificate the others accept.
pub fn bundle_holds(bundle: &str, cert_pem: &str) -> Result<bool, PkiError> {
    let want = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| invalid("a certificate", e))?;
    for cert in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        if cert.map_err(|e| invalid("a certificate bundle", e))? == want {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Authority;

    #[test]
    fn a_generated_token_reads_back_and_pins_its_ca_only() {
        let ca = Authority::generate("test-ca").unwrap();
        let other = Authority::generate("test-ca").unwrap();
        let token = JoinToken::generate(ca.cert_pem()).unwrap();
        let text = token.to_string();
        assert!(text.starts_with("K10") && text.len() == 3 + 64 + 2 + 6 + 1 + 16, "{text}");
        assert_eq!(JoinToken::parse(&text).unwrap(), token);
        assert!(token.check_pin(ca.cert_pem()).is_ok());
        let refused = token.check_pin(other.cert_pem()).unwrap_err().to_string();
        assert!(refused.contains("refusing to send the token"), "{refused}");
        assert!(!format!("{token:?}").contains(&token.secret), "Debug hides the secret");
        assert!(JoinToken::looks_like_bearer(&token.bearer()));
        assert_ne!(JoinToken::generate(ca.cert_pem()).unwrap().secret, token.secret);
    }

    #[test]
    fn a_bundle_holds_a_ca_only_if_one_of_its_certificates_is_that_ca() {
        let (a, b) = (Authority::generate("a").unwrap(), Authority::generate("b").unwrap());
        let both = format!("{}{}", b.cert_pem(), a.cert_pem());
        assert!(bundle_holds(&both, a.cert_pem()).unwrap(), "the second of two, as during a CA rotation");
        assert!(!bundle_holds(b.cert_pem(), a.cert_pem()).unwrap());
        assert!(bundle_holds("", a.cert_pem()).is_ok_and(|held| !held));
    }

    #[test]
    fn malformed_tokens_are_refused_with_the_reason() {
        let hash = "a".repeat(64);
        let bare = JoinToken::parse("abcdef.0123456789abcdef").unwrap();
        assert_eq!((bare.ca_hash.as_deref(), bare.id.as_str()), (None, "abcdef"));
        let ca = Authority::generate("test-ca").unwrap();
        assert!(bare.check_pin(ca.cert_pem()).is_err(), "a bare token pins nothing, so it never vouches for a CA");
        for (text, why) in [
            (format!("K10{hash}::abcdef"), "<id>.<secret>"),
            (format!("K10{}::abcdef.0123456789abcdef", "a".repeat(63)), "64 hex"),
            (format!("K11{hash}::abcdef.0123456789abcdef"), "expected K10"),
            (format!("K10{}::abcdef.0123456789abcdef", "g".repeat(64)), "64 hex"),
            ("ABCDEF.0123456789abcdef".to_string(), "[a-z0-9]"),
            ("abcdef.0123456789abcde".to_string(), "[a-z0-9]"),
            ("abcdef0123456789abcdef".to_string(), "<id>.<secret>"),
        ] {
            let e = JoinToken::parse(&text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        assert!(!JoinToken::looks_like_bearer("eyJhbGciOi.eyJzdWIi.sig"));
    }

    #[test]
    fn a_signing_request_gets_the_signers_subject_not_its_own() {
        let ca = Authority::generate("test-ca").unwrap();
        let (_key, csr) = crate::signing_request("system:masters-please").unwrap();
        let profile = crate::Profile::Client { user: "system:node:n1".into(), groups: vec!["system:nodes".into()] };
        let cert = ca.sign_request(&csr, &profile, crate::DEFAULT_VALIDITY).unwrap();
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let who = crate::identity(&der).unwrap();
        assert_eq!((who.user.as_str(), who.groups.as_slice()), ("system:node:n1", &["system:nodes".to_string()][..]));
        assert!(ca.sign_request("not a request", &profile, crate::DEFAULT_VALIDITY).is_err());
    }
}
