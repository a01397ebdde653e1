//! ServiceAccount admission, as Kubernetes' plugin of that name: a pod
//! created without a service account runs as `default`; the account must
//! exist; and unless the pod or its account opts out
//! (`automountServiceAccountToken: false`), the pod gets a projected
//! `kube-api-access-<suffix>` volume (a bound token the node agent asks for
//! and refreshes, the cluster CA from the `kube-root-ca.crt` ConfigMap,
//! and the namespace), mounted read-only into every container at
//! `/var/run/secrets/kubernetes.io/serviceaccount`.
//!
//! Legacy token Secrets are filled here too, as Kubernetes' tokens
//! controller fills them: a Secret of type
//! `kubernetes.io/service-account-token` created with the annotation
//! `kubernetes.io/service-account.name` gets the account's uid annotation,
//! and `token` (bound to the Secret and the account: it stops working when
//! either is deleted), `ca.crt` (from `kube-root-ca.crt`) and `namespace`
//! in its data. It is owned by the account, so the garbage collector
//! deletes it with the account, as the tokens controller would.
//!
//! It is a step of the registry rather than an
//! [`AdmissionPlugin`](crate::admission::AdmissionPlugin) because it reads
//! the ServiceAccount from the store. It runs only where service account
//! tokens are issued (`--service-account-signing-key-file`): elsewhere no
//! node could fill the volume. Mirror pods are left alone, as the kubelet
//! made them from files and cannot take a token for them.

use serde_json::{json, Value};
use skiff_api::pod_refs::DEFAULT_SERVICE_ACCOUNT;
use skiff_api::resources::{self, Kind};
use skiff_api::{meta, ApiError, FieldError};

use crate::admission::{forbidden, Attributes};
use crate::service_account::{Ref, Tokens};
use crate::storage::{Consistency, ObjectStore};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Where the volume is mounted in every container.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap each namespace gets with the cluster's CA (`ca.crt`).
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// Kubernetes' token lifetime for the volume: an hour and seven seconds,
/// so that tokens of this volume can be told apart in audits.
const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Runs the plugin on a pod being created (`attrs` for anything else is
/// passed over). `suffix` names the volume.
pub(crate) async fn admit(
    objects: &ObjectStore,
    attrs: &Attributes<'_>,
    pod: &mut Value,
    suffix: &str,
) -> Result<(), ApiError> {
    if attrs.resource.kind_id != Kind::Pod || attrs.verb != "create" || !attrs.subresource.is_empty() {
        return Ok(());
    }
    if pod.pointer("/metadata/annotations").and_then(|a| a.get(MIRROR_ANNOTATION)).is_some() {
        return Ok(());
    }
    let name = account_name(pod);
    let account = find_account(objects, attrs, &name).await?;
    mount_token(pod, &name, &account, suffix);
    Ok(())
}

/// The service account `name` in the request's namespace; 403 if there
/// is none.
async fn find_account(objects: &ObjectStore, attrs: &Attributes<'_>, name: &str) -> Result<Value, ApiError> {
    let key = resources::of(Kind::ServiceAccount).key(Some(attrs.namespace), name);
    let mut found = objects.get(&key, 0).await?.0;
    if found.is_none() {
        // Maybe created through another master and not applied here yet.
        objects.prepare_read(Consistency::Linearizable).await?;
        found = objects.get(&key, 0).await?.0;
    }
    let Some(account) = found else {
        return Err(forbidden(
            attrs,
            &format!(
                "error looking up service account {}/{name}: serviceaccount \"{name}\" not found",
                attrs.namespace
            ),
        ));
    };
    account_parts(&account.json)
}

/// What admission reads of a stored ServiceAccount, its uid and
/// `automountServiceAccountToken`, as a JSON object with just those: every
/// pod create reads its account, and decoding all of it (its managed
/// fields, its secrets) each time cost more than the rest of the lookup.
fn account_parts(json: &[u8]) -> Result<Value, ApiError> {
    #[derive(serde::Deserialize)]
    struct Account {
        #[serde(default)]
        metadata: Metadata,
        #[serde(rename = "automountServiceAccountToken", default)]
        automount: Value,
    }
    #[derive(serde::Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        uid: Value,
    }
    let account: Account = serde_json::from_slice(json)
        .map_err(|e| ApiError::internal(format!("stored service account is not JSON: {e}")))?;
    Ok(json!({"metadata": {"uid": account.metadata.uid}, "automountServiceAccountToken": account.automount}))
}

/// The type of a legacy service account token Secret.
const TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";
const ACCOUNT_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
const ACCOUNT_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// Fills a legacy token Secret being created (anything else is passed
/// over): the account's uid, the token, `ca.crt` and `namespace`, each
/// unless the Secret already has it. `attrs.name` is the Secret's final
/// name, and its uid is set.
pub(crate) async fn fill_token_secret(
    objects: &ObjectStore,
    tokens: &Tokens,
    attrs: &Attributes<'_>,
    secret: &mut Value,
) -> Result<(), ApiError> {
    if attrs.resource.kind_id != Kind::Secret || attrs.verb != "create" || secret["type"] != TOKEN_SECRET_TYPE {
        return Ok(());
    }
    let annotations = &secret["metadata"]["annotations"];
    let Some(account_name) = annotations[ACCOUNT_NAME_ANNOTATION].as_str().filter(|n| !n.is_empty()) else {
        let field = format!("metadata.annotations[{ACCOUNT_NAME_ANNOTATION}]");
        return Err(ApiError::invalid(attrs.resource, attrs.name, &[FieldError::required(field, "")]));
    };
    let account_name = account_name.to_string();
    let account = find_account(objects, attrs, &account_name).await?;
    let account_uid = meta::uid(&account).unwrap_or_default().to_string();
    if let Some(asked) = annotations[ACCOUNT_UID_ANNOTATION].as_str().filter(|u| !u.is_empty()) {
        if asked != account_uid {
            let field = format!("metadata.annotations[{ACCOUNT_UID_ANNOTATION}]");
            let why = format!("serviceaccount \"{account_name}\" has uid {account_uid}");
            return Err(ApiError::invalid(
                attrs.resource,
                attrs.name,
                &[FieldError::invalid(field, &json!(asked), why)],
            ));
        }
    }
    let ca = if secret["data"]["ca.crt"].is_string() { None } else { root_ca(objects, attrs.namespace).await? };
    let secret_ref = Ref { name: attrs.name.to_string(), uid: meta::uid(secret).unwrap_or_default().to_string() };
    let account_ref = Ref { name: account_name.clone(), uid: account_uid.clone() };

    let metadata = meta::meta_mut(secret);
    let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
    annotations[ACCOUNT_UID_ANNOTATION] = json!(account_uid);
    let owners = metadata.entry("ownerReferences").or_insert_with(|| json!([]));
    if let Some(owners) = owners.as_array_mut().filter(|o| !o.iter().any(|o| o["uid"] == account_uid.as_str())) {
        owners.push(json!({"apiVersion": "v1", "kind": "ServiceAccount", "name": account_name, "uid": account_uid}));
    }
    if !secret["data"].is_object() {
        secret["data"] = json!({});
    }
    let data = &mut secret["data"];
    let mut fill = |key: &str, value: &[u8]| {
        if !data[key].is_string() {
            data[key] = json!(STANDARD.encode(value));
        }
    };
    fill("token", tokens.secret_token(attrs.namespace, account_ref, secret_ref).as_bytes());
    fill("namespace", attrs.namespace.as_bytes());
    if let Some(ca) = ca {
        fill("ca.crt", ca.as_bytes());
    }
    Ok(())
}

/// The cluster CA the namespace's `kube-root-ca.crt` holds, if published.
async fn root_ca(objects: &ObjectStore, namespace: &str) -> Result<Option<String>, ApiError> {
    let key = resources::of(Kind::ConfigMap).key(Some(namespace), ROOT_CA_CONFIG_MAP);
    let Some(found) = objects.get(&key, 0).await?.0 else { return Ok(None) };
    Ok(found.decode()?["data"]["ca.crt"].as_str().map(str::to_string))
}

/// The account the pod names, else `default`.
fn account_name(pod: &Value) -> String {
    let spec = &pod["spec"];
    [&spec["serviceAccountName"], &spec["serviceAccount"]]
        .into_iter()
        .filter_map(Value::as_str)
        .find(|n| !n.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
        .to_string()
}

/// Sets the pod's account and, unless it or the account opts out, adds the
/// token volume and its mounts.
fn mount_token(pod: &mut Value, name: &str, account: &Value, suffix: &str) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    spec.insert("serviceAccountName".into(), json!(name));
    spec.insert("serviceAccount".into(), json!(name));
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return;
    }
    let volume_name = format!("kube-api-access-{suffix}");
    let mut mounted = false;
    for list in ["initContainers", "containers"] {
        for container in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            let mounts = container.as_object_mut().map(|c| c.entry("volumeMounts").or_insert_with(|| json!([])));
            let Some(mounts) = mounts.and_then(Value::as_array_mut) else { continue };
            if mounts.iter().any(|m| m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(MOUNT_PATH)) {
                continue;
            }
            mounts.push(json!({"name": volume_name, "readOnly": true, "mountPath": MOUNT_PATH}));
            mounted = true;
        }
    }
    if !mounted {
        return;
    }
    let volume = json!({
        "name": volume_name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [
                    {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                ]}}
            ]
        }
    });
    match spec.entry("volumes").or_insert_with(|| json!([])) {
        Value::Array(volumes) => volumes.push(volume),
        other => *other = json!([volume]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accounts_parts_read_as_the_whole_account() {
        let full = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "team", "uid": "u-1",
                "managedFields": [{"manager": "skiff", "fieldsV1": {"f:secrets": {}}}]},
            "secrets": [{"name": "t"}], "automountServiceAccountToken": false});
        for account in [full, json!({"metadata": {"name": "x"}}), json!({})] {
            let parts = account_parts(&serde_json::to_vec(&account).unwrap()).unwrap();
            assert_eq!(meta::uid(&parts), meta::uid(&account));
            assert_eq!(
                parts["automountServiceAccountToken"].as_bool(),
                account["automountServiceAccountToken"].as_bool()
            );
        }
        assert!(account_parts(b"[").is_err());
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "team"}, "spec": {
            "initContainers": [{"name": "init", "image": "i"}],
            "containers": [
                {"name": "web", "image": "w", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "own", "image": "o", "volumeMounts": [{"name": "mine", "mountPath": MOUNT_PATH}]}
            ],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }})
    }

    #[test]
    fn a_pod_runs_as_default_with_the_token_volume_in_every_container() {
        let mut p = pod();
        assert_eq!(account_name(&p), "default");
        mount_token(&mut p, "default", &json!({}), "abcde");
        let spec = &p["spec"];
        assert_eq!(
            (spec["serviceAccountName"].as_str(), spec["serviceAccount"].as_str()),
            (Some("default"), Some("default"))
        );
        let volume = &spec["volumes"][1];
        assert_eq!(volume["name"], "kube-api-access-abcde");
        let sources = &volume["projected"]["sources"];
        assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(sources[1]["configMap"]["name"], ROOT_CA_CONFIG_MAP);
        assert_eq!(sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"], "metadata.namespace");
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": MOUNT_PATH});
        assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(spec["containers"][0]["volumeMounts"][1], mount);
        // A container that mounts something of its own there keeps it.
        assert_eq!(spec["containers"][1]["volumeMounts"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_pod_or_its_account_may_opt_out_and_the_pod_wins() {
        let mut p = pod();
        mount_token(&mut p, "default", &json!({"automountServiceAccountToken": false}), "abcde");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1, "the account opted out");
        assert_eq!(p["spec"]["serviceAccountName"], "default");

        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(true);
        mount_token(&mut p, "default", &json!({"automountServiceAccountToken": false}), "abcde");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 2, "the pod opted back in");

        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(false);
        mount_token(&mut p, "default", &json!({}), "abcde");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_named_account_is_kept_and_the_old_field_is_read() {
        let mut p = pod();
        p["spec"]["serviceAccount"] = json!("builder");
        assert_eq!(account_name(&p), "builder");
        p["spec"]["serviceAccountName"] = json!("deployer");
        assert_eq!(account_name(&p), "deployer");
    }
}
