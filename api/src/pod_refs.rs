//! What a pod names in its own namespace and its node must read to run
//! it: Secrets, ConfigMaps, PersistentVolumeClaims and its ServiceAccount,
//! walked as Kubernetes' `VisitPodSecretNames` and `VisitPodConfigmapNames`
//! walk them (env, envFrom, volumes, projected sources, image pull
//! secrets, the secret references of volume plugins; init and ephemeral
//! containers included).
//!
//! One walker serves both sides of the node authorizer: the apiserver
//! builds its node graph from every pod write, decoding only these fields
//! ([`PodReferences::from_json`]), and the node agent reads exactly what
//! the graph lets it read ([`PodReferences::of`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Deserializer};

/// The ServiceAccount a pod without `serviceAccountName` runs as.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The names a pod references, all in the pod's namespace.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodReferences {
    /// `spec.nodeName`; empty while the pod is unbound.
    pub node_name: String,
    /// The ServiceAccount it runs as (empty if the spec names none).
    pub service_account: String,
    pub secrets: BTreeSet<String>,
    pub config_maps: BTreeSet<String>,
    pub claims: BTreeSet<String>,
}

impl PodReferences {
    /// The references of a pod's stored JSON; every other field is skipped
    /// unread.
    pub fn from_json(bytes: &[u8]) -> Result<PodReferences, serde_json::Error> {
        serde_json::from_slice::<Pod>(bytes).map(|pod| pod.references())
    }

    /// The references of a typed pod. It goes through JSON so that there
    /// is one walker; a node holds few pods, and reads them rarely.
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> PodReferences {
        serde_json::to_value(pod)
            .and_then(serde_json::from_value::<Pod>)
            .map(|pod| pod.references())
            .unwrap_or_default()
    }
}

/// `null` reads as the default, as an absent field does.
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

// The fields walked, mirroring k8s.io/api/core/v1; serde skips the rest.

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Pod {
    #[serde(deserialize_with = "nullable")]
    spec: Spec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    #[serde(deserialize_with = "nullable")]
    node_name: String,
    #[serde(deserialize_with = "nullable")]
    service_account_name: String,
    /// The deprecated alias of `serviceAccountName`.
    #[serde(deserialize_with = "nullable")]
    service_account: String,
    #[serde(deserialize_with = "nullable")]
    image_pull_secrets: Vec<Named>,
    #[serde(deserialize_with = "nullable")]
    containers: Vec<Container>,
    #[serde(deserialize_with = "nullable")]
    init_containers: Vec<Container>,
    #[serde(deserialize_with = "nullable")]
    ephemeral_containers: Vec<Container>,
    #[serde(deserialize_with = "nullable")]
    volumes: Vec<Volume>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Named {
    #[serde(deserialize_with = "nullable")]
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Container {
    #[serde(deserialize_with = "nullable")]
    env: Vec<Env>,
    #[serde(deserialize_with = "nullable")]
    env_from: Vec<EnvFrom>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Env {
    #[serde(deserialize_with = "nullable")]
    value_from: KeyRefs,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct KeyRefs {
    config_map_key_ref: Option<Named>,
    secret_key_ref: Option<Named>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct EnvFrom {
    config_map_ref: Option<Named>,
    secret_ref: Option<Named>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Volume {
    secret: Option<SecretVolume>,
    config_map: Option<Named>,
    projected: Option<Projected>,
    persistent_volume_claim: Option<Claim>,
    azure_file: Option<SecretVolume>,
    // Plugins that read a Secret for their credentials.
    csi: Option<PluginSecret>,
    cephfs: Option<PluginSecret>,
    cinder: Option<PluginSecret>,
    flex_volume: Option<PluginSecret>,
    iscsi: Option<PluginSecret>,
    rbd: Option<PluginSecret>,
    scale_io: Option<PluginSecret>,
    storageos: Option<PluginSecret>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SecretVolume {
    #[serde(deserialize_with = "nullable")]
    secret_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Claim {
    #[serde(deserialize_with = "nullable")]
    claim_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PluginSecret {
    secret_ref: Option<Named>,
    node_publish_secret_ref: Option<Named>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Projected {
    #[serde(deserialize_with = "nullable")]
    sources: Vec<ProjectedSource>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ProjectedSource {
    secret: Option<Named>,
    config_map: Option<Named>,
}

impl Pod {
    fn references(self) -> PodReferences {
        let spec = self.spec;
        let (mut secrets, mut config_maps, mut claims) = (Vec::new(), Vec::new(), BTreeSet::new());
        secrets.extend(spec.image_pull_secrets.into_iter().map(Some));
        let containers = spec.containers.into_iter().chain(spec.init_containers).chain(spec.ephemeral_containers);
        for c in containers {
            for e in c.env {
                secrets.push(e.value_from.secret_key_ref);
                config_maps.push(e.value_from.config_map_key_ref);
            }
            for e in c.env_from {
                secrets.push(e.secret_ref);
                config_maps.push(e.config_map_ref);
            }
        }
        for v in spec.volumes {
            secrets.push(v.secret.map(|s| Named { name: s.secret_name }));
            secrets.push(v.azure_file.map(|s| Named { name: s.secret_name }));
            let plugins = [v.csi, v.cephfs, v.cinder, v.flex_volume, v.iscsi, v.rbd, v.scale_io, v.storageos];
            for p in plugins.into_iter().flatten() {
                secrets.push(p.secret_ref);
                secrets.push(p.node_publish_secret_ref);
            }
            for source in v.projected.map(|p| p.sources).unwrap_or_default() {
                secrets.push(source.secret);
                config_maps.push(source.config_map);
            }
            config_maps.push(v.config_map);
            claims.extend(v.persistent_volume_claim.map(|c| c.claim_name).filter(|n| !n.is_empty()));
        }
        let names = |refs: Vec<Option<Named>>| -> BTreeSet<String> {
            refs.into_iter().flatten().map(|n| n.name).filter(|n| !n.is_empty()).collect()
        };
        PodReferences {
            node_name: spec.node_name,
            service_account: if spec.service_account_name.is_empty() {
                spec.service_account
            } else {
                spec.service_account_name
            },
            secrets: names(secrets),
            config_maps: names(config_maps),
            claims,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_place_a_pod_names_a_secret_or_config_map_is_found() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": "node-1",
                "serviceAccountName": "builder",
                "imagePullSecrets": [{"name": "pull"}],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
                "containers": [{
                    "name": "c",
                    "env": [
                        {"name": "A", "value": "x"},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                        {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                        {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "all-cm"}}]
                }],
                "ephemeralContainers": [{"name": "e", "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "debug", "key": "k"}}}]}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "vol-secret"}},
                    {"name": "m", "configMap": {"name": "vol-cm"}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "csi", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-creds"}}},
                    {"name": "p", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "proj-secret"}},
                        {"downwardAPI": {"items": []}}
                    ]}},
                    {"name": "t", "emptyDir": {}}
                ]
            },
            "status": {"phase": "Running"}
        });
        let refs = PodReferences::from_json(&serde_json::to_vec(&pod).unwrap()).unwrap();
        assert_eq!(refs.node_name, "node-1");
        assert_eq!(refs.service_account, "builder");
        assert_eq!(
            refs.secrets,
            set(&["pull", "init-env", "env-secret", "debug", "vol-secret", "csi-creds", "proj-secret"])
        );
        assert_eq!(refs.config_maps, set(&["env-cm", "all-cm", "vol-cm", "kube-root-ca.crt"]));
        assert_eq!(refs.claims, set(&["data"]));

        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
        assert_eq!(PodReferences::of(&typed), refs, "the typed pod walks the same");
    }

    #[test]
    fn nulls_and_a_missing_spec_read_as_nothing() {
        let refs = PodReferences::from_json(
            br#"{"spec": {"nodeName": null, "volumes": null, "containers": [{"env": null}]}}"#,
        )
        .unwrap();
        assert_eq!(refs, PodReferences::default());
        assert_eq!(PodReferences::from_json(b"{}").unwrap(), PodReferences::default());
        let old = PodReferences::from_json(br#"{"spec": {"serviceAccount": "legacy"}}"#).unwrap();
        assert_eq!(old.service_account, "legacy");
        assert!(PodReferences::from_json(b"[1]").is_err());
    }
}
