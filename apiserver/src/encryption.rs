//! Encryption at rest (`--encryption-provider-config`), in the spirit of
//! Kubernetes' `EncryptionConfiguration`: for each listed resource, a list
//! of providers. The first provider encrypts every write; every provider
//! listed may decrypt a read, so keys rotate without downtime:
//!
//! 1. add the new key second and restart every master (all can read it);
//! 2. move it first and restart again (writes use it);
//! 3. rewrite every object (`kubectl get secrets -A -o json | kubectl
//!    replace -f -`): an object read with any provider but the first is
//!    written again even when nothing else changed;
//! 4. remove the old key.
//!
//! Providers are `aesgcm` (AES-GCM with a 128- or 256-bit key and a random
//! 96-bit nonce per write, the ring implementation rustls already uses) and
//! `identity` (no encryption; lets a resource that was stored in the clear
//! be read while it is being encrypted, or be decrypted for good).
//! Encrypted values are stored as Kubernetes stores them,
//! `k8s:enc:aesgcm:v1:<key name>:<nonce><ciphertext and tag>`, with the
//! object's storage key as the authenticated data, so a value copied under
//! another key does not decrypt. What the etcd API on the client port
//! returns for such a key is that ciphertext.
//!
//! Random nonces bound how many writes one key should take (NIST's 2^32;
//! Kubernetes suggests rotating aesgcm keys every 200,000 writes).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;

/// What every encrypted value starts with.
pub const PREFIX: &[u8] = b"k8s:enc:";

/// The rules of one configuration; empty: nothing is encrypted.
#[derive(Clone, Default)]
pub struct Encryption {
    rules: Arc<Vec<Rule>>,
}

/// The providers of one resource.
struct Rule {
    /// Its storage prefix, ending in `/`.
    prefix: Vec<u8>,
    /// As configured: `secrets`, `deployments.apps`.
    resource: String,
    /// Shared by every resource of one configuration entry.
    providers: Arc<Vec<Provider>>,
}

enum Provider {
    Identity,
    AesGcm(Vec<Key>),
}

struct Key {
    name: String,
    cipher: LessSafeKey,
}

/// A stored value made readable.
#[derive(Debug)]
pub struct Opened<'a> {
    pub bytes: Cow<'a, [u8]>,
    /// It was not written by the first provider (and its first key): the
    /// next update writes it again even if nothing else changed.
    pub stale: bool,
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.rules.iter().map(|r| &r.resource)).finish()
    }
}

impl Encryption {
    /// Reads an `EncryptionConfiguration` file.
    pub fn load(path: &Path) -> Result<Encryption, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Encryption::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses an `EncryptionConfiguration` (YAML or JSON).
    pub fn parse(text: &str) -> Result<Encryption, String> {
        let doc: Value = serde_yaml::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
        let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
        if api_version != "apiserver.config.k8s.io/v1" || kind != "EncryptionConfiguration" {
            return Err(format!(
                "expected apiVersion apiserver.config.k8s.io/v1 and kind EncryptionConfiguration, \
                 got {api_version:?} and {kind:?}"
            ));
        }
        let entries = non_empty(&doc, "resources", "resources", "entry")?;
        let mut rules: Vec<Rule> = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("resources[{i}]");
            let names = non_empty(entry, "resources", &format!("{at}.resources"), "resource")?;
            let providers = non_empty(entry, "providers", &format!("{at}.providers"), "provider")?
                .iter()
                .enumerate()
                .map(|(k, p)| provider(p).map_err(|e| format!("{at}.providers[{k}]: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let providers = Arc::new(providers);
            for (j, name) in names.iter().enumerate() {
                let name = name.as_str().ok_or_else(|| format!("{at}.resources[{j}]: not a string"))?;
                let prefix = storage_prefix(name).map_err(|e| format!("{at}.resources[{j}]: {e}"))?;
                if rules.iter().any(|r| r.prefix == prefix.as_bytes()) {
                    return Err(format!("{at}.resources[{j}]: {name} is listed twice"));
                }
                rules.push(Rule {
                    prefix: prefix.into_bytes(),
                    resource: name.to_string(),
                    providers: providers.clone(),
                });
            }
        }
        Ok(Encryption { rules: Arc::new(rules) })
    }

    /// No resource is encrypted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn rule(&self, key: &[u8]) -> Option<&Rule> {
        self.rules.iter().find(|r| key.starts_with(&r.prefix))
    }

    /// What to store for `plain` under `key`.
    pub fn seal(&self, key: &[u8], plain: Vec<u8>) -> Vec<u8> {
        let Some(rule) = self.rule(key) else { return plain };
        match &rule.providers[0] {
            Provider::Identity => plain,
            Provider::AesGcm(keys) => keys[0].seal(key, plain),
        }
    }

    /// The plain bytes of what is stored under `key`.
    pub fn open<'a>(&self, key: &[u8], stored: &'a [u8]) -> Result<Opened<'a>, String> {
        let rule = self.rule(key);
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return match rule {
                None => Ok(Opened { bytes: Cow::Borrowed(stored), stale: false }),
                Some(rule) if rule.providers.iter().any(|p| matches!(p, Provider::Identity)) => {
                    let stale = !matches!(rule.providers[0], Provider::Identity);
                    Ok(Opened { bytes: Cow::Borrowed(stored), stale })
                }
                Some(rule) => Err(format!(
                    "{} is stored unencrypted and no identity provider is configured for {} to read it",
                    String::from_utf8_lossy(key),
                    rule.resource
                )),
            };
        };
        let rule = rule.ok_or_else(|| {
            format!("{} is encrypted, but no encryption provider is configured for it", String::from_utf8_lossy(key))
        })?;
        let (provider, rest) = split_field(rest).ok_or("a malformed encryption prefix")?;
        let (version, rest) = split_field(rest).ok_or("a malformed encryption prefix")?;
        let (name, sealed) = split_field(rest).ok_or("a malformed encryption prefix")?;
        if provider != "aesgcm" || version != "v1" {
            return Err(format!("{}: unknown encryption {provider}:{version}", String::from_utf8_lossy(key)));
        }
        for (index, p) in rule.providers.iter().enumerate() {
            let Provider::AesGcm(keys) = p else { continue };
            if let Some((position, k)) = keys.iter().enumerate().find(|(_, k)| k.name == name) {
                let plain = k.open(key, sealed).ok_or_else(|| {
                    format!(
                        "{}: decrypting with key {name} failed (wrong key or tampered data)",
                        String::from_utf8_lossy(key)
                    )
                })?;
                return Ok(Opened { bytes: Cow::Owned(plain), stale: index != 0 || position != 0 });
            }
        }
        Err(format!(
            "{} was encrypted with aesgcm key {name}, which is not configured for {}",
            String::from_utf8_lossy(key),
            rule.resource
        ))
    }
}

/// `value[field]` as a list with at least one `what` in it.
fn non_empty<'a>(value: &'a Value, field: &str, at: &str, what: &str) -> Result<&'a Vec<Value>, String> {
    value
        .get(field)
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| format!("{at}: at least one {what} is required"))
}

/// The text up to the next `:`, and what follows it.
fn split_field(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let end = bytes.iter().position(|b| *b == b':')?;
    Some((std::str::from_utf8(&bytes[..end]).ok()?, &bytes[end + 1..]))
}

/// Where a configured resource is stored: a built-in one by its qualified
/// name (`secrets`, `deployments.apps`); any other group-qualified name is
/// taken as a custom resource, stored as Kubernetes stores them.
fn storage_prefix(name: &str) -> Result<String, String> {
    if name.contains('*') {
        return Err(format!("{name}: wildcards are not supported; list each resource"));
    }
    if let Some(info) = skiff_api::resources::catalog().iter().find(|r| r.qualified() == name) {
        return Ok(info.prefix());
    }
    match name.split_once('.') {
        Some((plural, group)) if !plural.is_empty() && !group.is_empty() => Ok(format!("/registry/{group}/{plural}/")),
        _ => Err(format!("{name}: not a resource this cluster serves")),
    }
}

fn provider(p: &Value) -> Result<Provider, String> {
    let fields = p.as_object().filter(|o| o.len() == 1).ok_or("name exactly one provider")?;
    let (kind, config) = fields.iter().next().expect("one field");
    match kind.as_str() {
        "identity" => Ok(Provider::Identity),
        "aesgcm" => {
            let keys = non_empty(config, "keys", "aesgcm.keys", "key")?;
            let mut out: Vec<Key> = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                let at = format!("aesgcm.keys[{i}]");
                let name = k.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
                let name = name.ok_or_else(|| format!("{at}.name: required"))?;
                if name.contains(':') {
                    return Err(format!("{at}.name: {name:?} may not contain ':'"));
                }
                if out.iter().any(|k| k.name == name) {
                    return Err(format!("{at}.name: {name} is listed twice"));
                }
                let secret = k.get("secret").and_then(Value::as_str).ok_or_else(|| format!("{at}.secret: required"))?;
                let secret = base64::engine::general_purpose::STANDARD
                    .decode(secret.trim())
                    .map_err(|e| format!("{at}.secret: not base64: {e}"))?;
                let algorithm = match secret.len() {
                    16 => &AES_128_GCM,
                    32 => &AES_256_GCM,
                    n => return Err(format!("{at}.secret: {n} bytes; AES-GCM keys here are 16 or 32 bytes")),
                };
                let unbound = UnboundKey::new(algorithm, &secret).map_err(|_| format!("{at}.secret: rejected"))?;
                out.push(Key { name: name.to_string(), cipher: LessSafeKey::new(unbound) });
            }
            Ok(Provider::AesGcm(out))
        }
        "aescbc" | "secretbox" | "kms" => Err(format!("{kind} is not supported; use aesgcm")),
        other => Err(format!("unknown provider {other:?}")),
    }
}

impl Key {
    fn seal(&self, key: &[u8], mut plain: Vec<u8>) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).expect("the system's random source works");
        self.cipher
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(key), &mut plain)
            .expect("AES-GCM seals any value under 64 GiB");
        let mut out = Vec::with_capacity(PREFIX.len() + 16 + self.name.len() + NONCE_LEN + plain.len());
        out.extend_from_slice(PREFIX);
        out.extend_from_slice(b"aesgcm:v1:");
        out.extend_from_slice(self.name.as_bytes());
        out.push(b':');
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&plain);
        out
    }

    fn open(&self, key: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = ciphertext.to_vec();
        let plain = self.cipher.open_in_place(nonce, Aad::from(key), &mut buf).ok()?;
        let n = plain.len();
        buf.truncate(n);
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
    const KEY2: &str = "ZmVkY2JhOTg3NjU0MzIxMA=="; // 16 bytes

    fn config(providers: &str) -> Encryption {
        Encryption::parse(&format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
             - resources: [secrets, widgets.example.com]\n  providers:\n{providers}"
        ))
        .unwrap()
    }

    fn aesgcm(keys: &[(&str, &str)]) -> String {
        let mut s = "  - aesgcm:\n      keys:\n".to_string();
        for (name, secret) in keys {
            s += &format!("        - name: {name}\n          secret: {secret}\n");
        }
        s
    }

    const SECRET: &[u8] = b"/registry/secrets/default/s";

    #[test]
    fn secrets_are_sealed_with_the_first_key_and_open_to_the_same_bytes() {
        let enc = config(&(aesgcm(&[("k1", KEY1), ("k2", KEY2)]) + "  - identity: {}\n"));
        let plain = br#"{"kind":"Secret","data":{"a":"c2VjcmV0"}}"#.to_vec();
        let sealed = enc.seal(SECRET, plain.clone());
        assert!(sealed.starts_with(b"k8s:enc:aesgcm:v1:k1:"), "{}", String::from_utf8_lossy(&sealed));
        assert!(!sealed.windows(8).any(|w| w == b"c2VjcmV0"), "the plaintext shows through");
        let opened = enc.open(SECRET, &sealed).unwrap();
        assert_eq!(opened.bytes.as_ref(), plain.as_slice());
        assert!(!opened.stale);
        // Two writes of the same object differ (fresh nonces).
        assert_ne!(enc.seal(SECRET, plain.clone()), sealed);
        // Custom resources by their qualified name.
        assert!(enc.seal(b"/registry/example.com/widgets/default/w", plain.clone()).starts_with(PREFIX));
    }

    #[test]
    fn other_resources_pass_through_untouched() {
        let enc = config(&aesgcm(&[("k1", KEY1)]));
        let plain = br#"{"kind":"ConfigMap"}"#.to_vec();
        let keys: [&[u8]; 3] =
            [b"/registry/configmaps/default/c", b"/registry/secretsx/default/c", b"/registry/secrets"];
        for key in keys {
            assert_eq!(enc.seal(key, plain.clone()), plain);
            assert_eq!(enc.open(key, &plain).unwrap().bytes.as_ref(), plain.as_slice());
        }
    }

    #[test]
    fn a_value_moved_to_another_key_or_tampered_with_does_not_decrypt() {
        let enc = config(&aesgcm(&[("k1", KEY1)]));
        let sealed = enc.seal(SECRET, b"{}".to_vec());
        let err = enc.open(b"/registry/secrets/default/other", &sealed).unwrap_err();
        assert!(err.contains("decrypting with key k1 failed"), "{err}");
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(enc.open(SECRET, &flipped).is_err());
        assert!(enc.open(SECRET, b"k8s:enc:aesgcm:v1:k1:short").is_err());
        assert!(enc.open(SECRET, b"k8s:enc:nonsense").is_err());
    }

    #[test]
    fn keys_rotate_old_values_read_as_stale_until_rewritten() {
        let old = config(&aesgcm(&[("k1", KEY1)]));
        let sealed = old.seal(SECRET, b"{}".to_vec());
        // Step 1: the new key is known but second; step 2: it is first.
        let both = config(&aesgcm(&[("k1", KEY1), ("k2", KEY2)]));
        assert!(!both.open(SECRET, &sealed).unwrap().stale);
        let rotated = config(&aesgcm(&[("k2", KEY2), ("k1", KEY1)]));
        let opened = rotated.open(SECRET, &sealed).unwrap();
        assert!(opened.stale);
        let rewritten = rotated.seal(SECRET, opened.bytes.into_owned());
        assert!(rewritten.starts_with(b"k8s:enc:aesgcm:v1:k2:"));
        // Step 4: the old key is gone; rewritten values still read, old ones name the key.
        let new = config(&aesgcm(&[("k2", KEY2)]));
        assert!(!new.open(SECRET, &rewritten).unwrap().stale);
        let err = new.open(SECRET, &sealed).unwrap_err();
        assert!(err.contains("key k1, which is not configured"), "{err}");
    }

    #[test]
    fn plaintext_reads_only_with_identity_and_is_stale_behind_a_key() {
        let plain = b"{}".to_vec();
        let migrating = config(&(aesgcm(&[("k1", KEY1)]) + "  - identity: {}\n"));
        assert!(migrating.open(SECRET, &plain).unwrap().stale);
        let strict = config(&aesgcm(&[("k1", KEY1)]));
        assert!(strict.open(SECRET, &plain).unwrap_err().contains("no identity provider"));
        // Decrypting for good: identity first, the key still readable.
        let decrypting = config(&("  - identity: {}\n".to_string() + &aesgcm(&[("k1", KEY1)])));
        let sealed = strict.seal(SECRET, plain.clone());
        assert!(decrypting.open(SECRET, &sealed).unwrap().stale);
        assert_eq!(decrypting.seal(SECRET, plain.clone()), plain);
        // Encrypted data with no provider configured at all is an error, not garbage.
        assert!(Encryption::default().open(SECRET, &sealed).unwrap_err().contains("no encryption provider"));
    }

    #[test]
    fn bad_configurations_say_what_is_wrong() {
        let bad = |providers: &str, resources: &str| {
            Encryption::parse(&format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                 - resources: {resources}\n  providers:\n{providers}"
            ))
            .unwrap_err()
        };
        let ok = aesgcm(&[("k1", KEY1)]);
        assert!(bad(&ok, "[nothings]").contains("not a resource this cluster serves"));
        assert!(bad(&ok, "['*.*']").contains("wildcards"));
        assert!(bad(&ok, "[secrets, secrets]").contains("listed twice"));
        assert!(bad(&ok, "[]").contains("at least one resource"));
        assert!(bad(&aesgcm(&[("k1", "c2hvcnQ=")]), "[secrets]").contains("16 or 32 bytes"));
        assert!(bad(&aesgcm(&[("k1", "not*base64")]), "[secrets]").contains("not base64"));
        assert!(bad(&aesgcm(&[("k1", KEY1), ("k1", KEY2)]), "[secrets]").contains("listed twice"));
        assert!(bad(&aesgcm(&[("a:b", KEY1)]), "[secrets]").contains("may not contain ':'"));
        assert!(bad("  - aescbc:\n      keys: []\n", "[secrets]").contains("use aesgcm"));
        assert!(bad("  - rot13: {}\n", "[secrets]").contains("unknown provider"));
        let no_providers = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                            - {resources: [secrets], providers: []}\n";
        assert!(Encryption::parse(no_providers).unwrap_err().contains("at least one provider"));
        assert!(Encryption::parse("kind: Pod").unwrap_err().contains("EncryptionConfiguration"));
        assert!(Encryption::parse(": :").unwrap_err().contains("not YAML"));
    }
}
