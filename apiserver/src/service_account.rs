//! Service account tokens, as Kubernetes' bound tokens: JWTs signed ES256
//! with the cluster's service account key (`--service-account-signing-key-
//! file`, the same on every master), issued by the TokenRequest
//! subresource (`kubectl create token SA [--bound-object-kind Pod
//! --bound-object-name P] [--duration 1h]`) and accepted as bearer tokens.
//!
//! A token names its service account and, when bound, the pod or Secret
//! it was issued for, each with its uid. It authenticates as
//! `system:serviceaccount:<namespace>:<name>` (groups
//! `system:serviceaccounts` and `system:serviceaccounts:<namespace>`)
//! only while it has not expired, its audience includes this issuer, and
//! the objects it names still exist with those uids: deleting the pod (or
//! the service account) revokes its tokens at once.
//!
//! The JWT is built here with ring rather than a JWT crate: the format is
//! three base64url segments and one fixed-size ES256 signature, and only
//! that one algorithm is accepted (no `alg` negotiation to get wrong).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skiff_api::resources::{self, Kind};
use skiff_api::{meta, ApiError};

use crate::admission::UserInfo;
use crate::storage::ObjectStore;

/// What tokens are issued for unless the request names audiences.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// A token's lifetime unless asked otherwise (Kubernetes: one hour).
const DEFAULT_EXPIRATION: i64 = 3600;
/// The shortest lifetime a request may ask for (Kubernetes: 10 minutes).
const MIN_EXPIRATION: i64 = 600;
/// The longest (Kubernetes caps it by configuration; here a day).
const MAX_EXPIRATION: i64 = 24 * 3600;

/// `--service-account-signing-key-file` and `--service-account-issuer`.
#[derive(Clone, Debug)]
pub struct ServiceAccountConfig {
    pub signing_key_file: std::path::PathBuf,
    pub issuer: String,
}

/// The signing key and the issuer: signs and verifies, no I/O.
pub struct Signer {
    key: EcdsaKeyPair,
    public: Vec<u8>,
    key_id: String,
    issuer: String,
}

/// The signer, and the store bindings are checked in.
pub struct Tokens {
    signer: Signer,
    objects: ObjectStore,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("issuer", &self.signer.issuer).field("key_id", &self.signer.key_id).finish()
    }
}

/// The `kubernetes.io` claim: what the token is bound to.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Bound {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Ref>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Bound,
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Signer {
    pub fn from_pkcs8(der: &[u8], issuer: &str) -> Result<Signer, String> {
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &SystemRandom::new())
            .map_err(|e| format!("the service account signing key: {e}"))?;
        let public = ring::signature::KeyPair::public_key(&key).as_ref().to_vec();
        let key_id = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &public));
        Ok(Signer { key, public, key_id, issuer: issuer.to_string() })
    }

    /// A signed token carrying `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        let header = json!({"alg": "ES256", "kid": self.key_id});
        let mut token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).expect("JSON")),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("JSON"))
        );
        let signature = self.key.sign(&SystemRandom::new(), token.as_bytes()).expect("ES256 signs");
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
        token
    }

    /// The claims of a token this cluster signed, if its signature holds;
    /// `None` for anything else (another issuer's token, a static token).
    pub fn verify_signature(&self, token: &str) -> Option<Claims> {
        let mut parts = token.split('.');
        let (header, payload, signature) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
        if header["alg"] != "ES256" {
            return None;
        }
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        let signed = &token[..header_and_payload_len(token)?];
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public).verify(signed.as_bytes(), &signature).ok()?;
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
    }

    /// Why verified `claims` do not authenticate at `now`, if they do not
    /// (the bound objects aside).
    pub fn check_claims(&self, claims: &Claims, now: i64) -> Result<(), &'static str> {
        if claims.iss != self.issuer {
            return Err("another issuer");
        }
        if claims.exp <= now || claims.nbf > now + 60 {
            return Err("expired or not yet valid");
        }
        if !claims.aud.iter().any(|a| a == &self.issuer) {
            return Err("not for this audience");
        }
        let b = &claims.kubernetes;
        if claims.sub != format!("system:serviceaccount:{}:{}", b.namespace, b.serviceaccount.name) {
            return Err("subject and service account disagree");
        }
        Ok(())
    }
}

impl Tokens {
    pub fn new(signer: Signer, objects: ObjectStore) -> Tokens {
        Tokens { signer, objects }
    }

    /// Who a bearer token is: `Ok(None)` if it is not one of this
    /// cluster's service account tokens; 401 if it is but no longer holds.
    pub async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ApiError> {
        let Some(claims) = self.signer.verify_signature(token) else { return Ok(None) };
        let refuse = |why: &str| {
            tracing::debug!(subject = %claims.sub, why, "service account token refused");
            Err(ApiError::unauthorized("Unauthorized"))
        };
        if let Err(why) = self.signer.check_claims(&claims, now()) {
            return refuse(why);
        }
        let b = &claims.kubernetes;
        let bindings = [
            (Kind::ServiceAccount, Some(&b.serviceaccount)),
            (Kind::Pod, b.pod.as_ref()),
            (Kind::Secret, b.secret.as_ref()),
        ];
        for (kind, bound) in bindings {
            let Some(bound) = bound else { continue };
            if self.uid_of(kind, &b.namespace, &bound.name).await?.as_deref() != Some(bound.uid.as_str()) {
                return refuse("a bound object is gone");
            }
        }
        Ok(Some(service_account_user(&b.namespace, &b.serviceaccount.name)))
    }

    /// The uid of an object as this member has it (a delete through another
    /// master takes effect here once applied, as Kubernetes' caches do).
    async fn uid_of(&self, kind: Kind, namespace: &str, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self.live(kind, namespace, name).await?.and_then(|obj| meta::uid(&obj).map(str::to_string)))
    }

    /// An object that exists and is not being deleted.
    async fn live(&self, kind: Kind, namespace: &str, name: &str) -> Result<Option<Value>, ApiError> {
        let key = resources::of(kind).key(Some(namespace), name);
        match self.objects.get(&key, 0).await?.0 {
            None => Ok(None),
            Some(stored) => Ok(Some(stored.decode()?).filter(|obj| meta::deletion_timestamp(obj).is_none())),
        }
    }

    /// Answers a TokenRequest for service account `sa` (already read, so
    /// it exists) in `namespace`: validates the request, checks the bound
    /// object, signs.
    pub async fn request(&self, namespace: &str, sa: &Value, request: &Value) -> Result<Value, ApiError> {
        let sa_name = meta::name(sa).unwrap_or_default().to_string();
        let invalid = |field: &str, why: String| {
            ApiError::new(
                skiff_api::Reason::Invalid,
                format!("TokenRequest.authentication.k8s.io \"{sa_name}\" is invalid: {field}: {why}"),
            )
        };
        let spec = &request["spec"];
        let expiration = spec["expirationSeconds"].as_i64().unwrap_or(DEFAULT_EXPIRATION);
        if expiration < MIN_EXPIRATION {
            return Err(invalid(
                "spec.expirationSeconds",
                format!("Invalid value: {expiration}: may not specify a duration less than 10 minutes"),
            ));
        }
        let expiration = expiration.min(MAX_EXPIRATION);
        let audiences: Vec<String> = spec["audiences"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .filter(|a: &Vec<String>| !a.is_empty())
            .unwrap_or_else(|| vec![self.signer.issuer.clone()]);
        let mut bound = Bound {
            namespace: namespace.to_string(),
            serviceaccount: Ref { name: sa_name.clone(), uid: meta::uid(sa).unwrap_or_default().to_string() },
            pod: None,
            secret: None,
        };
        let object = &spec["boundObjectRef"];
        if object.is_object() {
            let kind = object["kind"].as_str().unwrap_or_default();
            let name = object["name"].as_str().unwrap_or_default();
            let target = match kind {
                "Pod" => Kind::Pod,
                "Secret" => Kind::Secret,
                other => {
                    return Err(invalid(
                        "spec.boundObjectRef.kind",
                        format!("Unsupported value: {other:?}: supported values: \"Pod\", \"Secret\""),
                    ))
                }
            };
            let Some(found) = self.live(target, namespace, name).await? else {
                return Err(ApiError::new(
                    skiff_api::Reason::NotFound,
                    format!("{} \"{name}\" not found", resources::of(target).plural),
                ));
            };
            let uid = meta::uid(&found).unwrap_or_default().to_string();
            let runs_as = found["spec"]["serviceAccountName"].as_str().filter(|s| !s.is_empty()).unwrap_or("default");
            if target == Kind::Pod && runs_as != sa_name {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount \"{sa_name}\" to pod running with different serviceaccount name."
                )));
            }
            if let Some(asked) = object["uid"].as_str().filter(|u| !u.is_empty()) {
                if asked != uid {
                    return Err(ApiError::new(
                        skiff_api::Reason::Conflict,
                        format!(
                            "the UID in the bound object reference ({asked}) does not match the UID in record. \
                             The object might have been deleted and then recreated"
                        ),
                    ));
                }
            }
            let r = Ref { name: name.to_string(), uid };
            match target {
                Kind::Pod => bound.pod = Some(r),
                _ => bound.secret = Some(r),
            }
        }
        let t = now();
        let claims = Claims {
            iss: self.signer.issuer.clone(),
            sub: format!("system:serviceaccount:{namespace}:{sa_name}"),
            aud: audiences.clone(),
            exp: t + expiration,
            iat: t,
            nbf: t,
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: bound,
        };
        let expires = chrono::DateTime::from_timestamp(claims.exp, 0).unwrap_or_default();
        let mut out = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": sa_name, "namespace": namespace, "creationTimestamp": null},
            "spec": {"audiences": audiences, "expirationSeconds": expiration,
                     "boundObjectRef": if object.is_object() { object.clone() } else { Value::Null }},
            "status": {"token": self.signer.sign(&claims),
                       "expirationTimestamp": expires.format("%Y-%m-%dT%H:%M:%SZ").to_string()},
        });
        if !object.is_object() {
            out["spec"].as_object_mut().expect("an object").remove("boundObjectRef");
        }
        Ok(out)
    }
}

impl Tokens {
    /// The token of a legacy service account token Secret: bound to the
    /// account and the Secret, so it holds until either is deleted.
    /// Kubernetes' legacy tokens never expire; this one's expiry is a
    /// century away.
    pub fn secret_token(&self, namespace: &str, account: Ref, secret: Ref) -> String {
        let t = now();
        let claims = Claims {
            iss: self.signer.issuer.clone(),
            sub: format!("system:serviceaccount:{namespace}:{}", account.name),
            aud: vec![self.signer.issuer.clone()],
            exp: t + LEGACY_EXPIRATION,
            iat: t,
            nbf: t,
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: Bound {
                namespace: namespace.to_string(),
                serviceaccount: account,
                pod: None,
                secret: Some(secret),
            },
        };
        self.signer.sign(&claims)
    }
}

/// A legacy Secret token's lifetime: "never", in seconds.
const LEGACY_EXPIRATION: i64 = 100 * 365 * 24 * 3600;

/// Where the signed part of a JWT ends (before the second dot).
fn header_and_payload_len(token: &str) -> Option<usize> {
    let first = token.find('.')?;
    let second = token[first + 1..].find('.')?;
    Some(first + 1 + second)
}

/// The user a service account's token authenticates as.
pub fn service_account_user(namespace: &str, name: &str) -> UserInfo {
    UserInfo {
        name: format!("system:serviceaccount:{namespace}:{name}"),
        groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}")],
    }
}

impl Signer {
    /// The signer `config` names.
    pub fn load(config: &ServiceAccountConfig) -> Result<Signer, String> {
        let der = skiff_pki::signing_key_der(&config.signing_key_file).map_err(|e| e.to_string())?;
        Signer::from_pkcs8(&der, &config.issuer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        let dir = tempfile::tempdir().unwrap();
        let path = skiff_pki::load_or_create_signing_key(dir.path()).unwrap();
        Signer::from_pkcs8(&skiff_pki::signing_key_der(&path).unwrap(), DEFAULT_ISSUER).unwrap()
    }

    fn claims(exp_in: i64) -> Claims {
        let t = now();
        Claims {
            iss: DEFAULT_ISSUER.into(),
            sub: "system:serviceaccount:team:robot".into(),
            aud: vec![DEFAULT_ISSUER.into()],
            exp: t + exp_in,
            iat: t,
            nbf: t,
            jti: "j".into(),
            kubernetes: Bound {
                namespace: "team".into(),
                serviceaccount: Ref { name: "robot".into(), uid: "u1".into() },
                pod: Some(Ref { name: "web".into(), uid: "u2".into() }),
                secret: None,
            },
        }
    }

    #[test]
    fn a_signed_token_verifies_and_carries_its_claims() {
        let s = signer();
        let token = s.sign(&claims(600));
        assert_eq!(token.split('.').count(), 3);
        let got = s.verify_signature(&token).expect("verifies");
        assert_eq!(got, claims(600).clone_with_times(&got));
        assert_eq!(s.check_claims(&got, now()), Ok(()));
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
        assert_eq!(header["alg"], "ES256");
    }

    #[test]
    fn forged_altered_foreign_and_expired_tokens_do_not_authenticate() {
        let s = signer();
        let token = s.sign(&claims(600));
        // Another key's signature over the same claims.
        assert!(signer().verify_signature(&token).is_none());
        // Claims altered after signing.
        let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
        let mut altered = claims(600);
        altered.kubernetes.namespace = "kube-system".into();
        parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&altered).unwrap());
        assert!(s.verify_signature(&parts.join(".")).is_none());
        // alg none, and garbage.
        let none = format!("{}.{}.", URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#), parts[1]);
        assert!(s.verify_signature(&none).is_none());
        assert!(s.verify_signature("s3cret-static-token").is_none());
        assert!(s.verify_signature("a.b.c.d").is_none());
        // Valid signatures whose claims do not hold.
        assert_eq!(s.check_claims(&claims(-1), now()), Err("expired or not yet valid"));
        let mut other_audience = claims(600);
        other_audience.aud = vec!["vault".into()];
        assert_eq!(s.check_claims(&other_audience, now()), Err("not for this audience"));
        let mut impostor = claims(600);
        impostor.sub = "system:serviceaccount:kube-system:admin".into();
        assert_eq!(s.check_claims(&impostor, now()), Err("subject and service account disagree"));
        let mut foreign = claims(600);
        foreign.iss = "https://elsewhere".into();
        assert_eq!(s.check_claims(&foreign, now()), Err("another issuer"));
    }

    impl Claims {
        /// `self` with `other`'s times (the two were made a moment apart).
        fn clone_with_times(&self, other: &Claims) -> Claims {
            Claims { exp: other.exp, iat: other.iat, nbf: other.nbf, ..self.clone() }
        }
    }
}
