//! A typed view of one resource: [`Api<K>`] over a k8s-openapi type, on the
//! dynamic [`Client`] (which stays usable with `serde_json::Value` for code
//! that handles many kinds, such as the controllers' action executor).
//!
//! The resource is found from the type's `apiVersion` and `kind` in the
//! catalog, so a type Skiff does not serve fails every call with
//! [`ClientError::UnknownKind`] instead of panicking. Errors keep the
//! server's Kubernetes reason ([`ClientError::reason`]).

use std::fmt;
use std::marker::PhantomData;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use skiff_api::watch::EventType;
use skiff_api::{ApiError, ResourceInfo};

use crate::resources::{Client, ClientError};
pub use crate::resources::{DeleteParams, ListParams, WatchParams};

/// What a typed [`Api`] can hold: any k8s-openapi resource type.
pub trait Resource:
    k8s_openapi::Resource
    + k8s_openapi::Metadata<Ty = ObjectMeta>
    + Serialize
    + DeserializeOwned
    + Clone
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Resource for K where
    K: k8s_openapi::Resource
        + k8s_openapi::Metadata<Ty = ObjectMeta>
        + Serialize
        + DeserializeOwned
        + Clone
        + fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// One page (or all pages) of a typed list.
#[derive(Clone, Debug)]
pub struct ObjectList<K> {
    /// The objects, in the server's order.
    pub items: Vec<K>,
    /// The revision the list was read at; a watch from it misses nothing.
    pub resource_version: String,
    /// Set when more pages follow: pass it back as
    /// [`ListParams::continue_token`].
    pub continue_token: String,
}

/// One typed watch event. A watch's `ERROR` event arrives as an `Err` of
/// the stream instead.
#[derive(Clone, Debug)]
pub enum WatchEvent<K> {
    /// The object was created.
    Added(K),
    /// The object changed.
    Modified(K),
    /// The object was deleted (its last state).
    Deleted(K),
    /// Every change up to this resourceVersion has been sent.
    Bookmark(String),
}

/// A stream of typed watch events from one apiserver.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ClientError>>;

/// What a watcher lists and watches: an [`Api`] in production, a fake in
/// tests.
pub trait ListWatch<K>: Send + Sync + 'static {
    /// One page of the list.
    fn list(&self, params: ListParams) -> BoxFuture<'_, Result<ObjectList<K>, ClientError>>;
    /// A watch from `params.resource_version`.
    fn watch(&self, params: WatchParams) -> BoxFuture<'_, Result<WatchStream<K>, ClientError>>;
}

/// The typed resource API of `K` in one namespace or all of them.
pub struct Api<K> {
    client: Client,
    /// `None`: `K` is not served; every call fails with `UnknownKind`.
    info: Option<&'static ResourceInfo>,
    /// "" for all namespaces (and for cluster-scoped resources).
    namespace: String,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api { client: self.client.clone(), info: self.info, namespace: self.namespace.clone(), _kind: PhantomData }
    }
}

impl<K> fmt::Debug for Api<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("resource", &self.info.map(|i| i.plural))
            .field("namespace", &self.namespace)
            .finish()
    }
}

/// The JSON of a typed object.
pub(crate) fn to_value<K: Serialize>(obj: &K) -> Result<Value, ClientError> {
    serde_json::to_value(obj).map_err(|e| ClientError::Encode(e.to_string()))
}

/// A typed object from its JSON.
pub(crate) fn from_value<K: DeserializeOwned>(value: Value) -> Result<K, ClientError> {
    serde_json::from_value(value).map_err(|e| ClientError::Decode(e.to_string()))
}

/// A watched object, decoded without its `metadata.managedFields`: the
/// informers (this watch's callers) drop them anyway, and they are about
/// half of a pod's JSON. Decoded through a [`Value`], whose arrays know
/// their lengths: decoded from the bytes directly, each vector of `K`
/// kept the spare room of its growth (a pod's container statuses, its
/// tolerations), and the scheduler's cache of 5,000 nodes and 15,000 pods
/// grew by 36 MiB (15%).
fn watched<K: DeserializeOwned>(json: &[u8]) -> Result<K, ClientError> {
    let mut value: Value = serde_json::from_slice(json).map_err(|e| ClientError::Decode(e.to_string()))?;
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    from_value(value)
}

impl<K: Resource> Api<K> {
    fn new(client: Client, namespace: &str) -> Api<K> {
        let info = skiff_api::resources::by_kind(K::API_VERSION, K::KIND);
        Api { client, info, namespace: namespace.to_string(), _kind: PhantomData }
    }

    /// Objects in `namespace` (for a cluster-scoped type the namespace is
    /// ignored).
    pub fn namespaced(client: Client, namespace: &str) -> Api<K> {
        Api::new(client, namespace)
    }

    /// Objects in every namespace (or, for a cluster-scoped type, all of
    /// them). Writes take the namespace from the object, or fail for
    /// calls by name.
    pub fn all(client: Client) -> Api<K> {
        Api::new(client, "")
    }

    /// The resource behind `K`.
    pub fn resource(&self) -> Result<&'static ResourceInfo, ClientError> {
        self.info.ok_or_else(|| ClientError::UnknownKind {
            api_version: K::API_VERSION.to_string(),
            kind: K::KIND.to_string(),
        })
    }

    /// The namespace this API is scoped to ("" for all).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The underlying dynamic client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The namespace a write of `obj` goes to: the object's own, else this
    /// API's.
    fn namespace_of<'a>(&'a self, obj: &'a K) -> &'a str {
        obj.metadata().namespace.as_deref().filter(|ns| !ns.is_empty()).unwrap_or(&self.namespace)
    }

    /// The object named `name`.
    pub async fn get(&self, name: &str) -> Result<K, ClientError> {
        from_value(self.client.get(self.resource()?, &self.namespace, name).await?)
    }

    /// The object named `name`, or `None` if there is none.
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, ClientError> {
        match self.get(name).await {
            Ok(obj) => Ok(Some(obj)),
            Err(e) if e.is(skiff_api::Reason::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One page of the list (`params.limit` 0: all objects at once).
    pub async fn list(&self, params: &ListParams) -> Result<ObjectList<K>, ClientError> {
        let list = self.client.list(self.resource()?, &self.namespace, params).await?;
        Ok(ObjectList {
            items: list.items.into_iter().map(from_value).collect::<Result<_, _>>()?,
            resource_version: list.resource_version,
            continue_token: list.continue_token,
        })
    }

    /// Creates `obj` (in its namespace, else this API's).
    pub async fn create(&self, obj: &K) -> Result<K, ClientError> {
        let value = to_value(obj)?;
        from_value(self.client.create(self.resource()?, self.namespace_of(obj), &value).await?)
    }

    /// Replaces `obj`; its `metadata.resourceVersion`, when set, makes this
    /// a compare-and-swap that fails with `Conflict` if the object changed.
    pub async fn replace(&self, obj: &K) -> Result<K, ClientError> {
        self.replace_subresource(obj, "").await
    }

    /// Replaces `obj`'s `status` (compare-and-swap as [`Api::replace`]).
    pub async fn replace_status(&self, obj: &K) -> Result<K, ClientError> {
        self.replace_subresource(obj, "status").await
    }

    async fn replace_subresource(&self, obj: &K, subresource: &str) -> Result<K, ClientError> {
        let mut value = to_value(obj)?;
        let namespace = self.namespace_of(obj).to_string();
        if !namespace.is_empty() && self.resource()?.namespaced {
            skiff_api::meta::set_str(&mut value, "namespace", &namespace);
        }
        from_value(self.client.update_subresource(self.resource()?, &value, subresource).await?)
    }

    /// Applies a JSON merge patch (RFC 7386) to the object named `name`.
    pub async fn patch(&self, name: &str, patch: &Value) -> Result<K, ClientError> {
        from_value(self.client.patch(self.resource()?, &self.namespace, name, "merge", patch, "").await?)
    }

    /// Applies a JSON merge patch to the `status` of the object named `name`.
    pub async fn patch_status(&self, name: &str, patch: &Value) -> Result<K, ClientError> {
        from_value(self.client.patch(self.resource()?, &self.namespace, name, "merge", patch, "status").await?)
    }

    /// Deletes the object named `name`. `params.uid` (a precondition) makes
    /// sure a newer object of the same name is never deleted instead;
    /// `params.propagation_policy` picks `Background`, `Foreground` or
    /// `Orphan`. Returns the server's answer (the object while finalizers
    /// hold it, else a `Status`).
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> Result<Value, ClientError> {
        self.client.delete(self.resource()?, &self.namespace, name, params).await
    }

    /// A watch from `params.resource_version` on one apiserver. The stream
    /// ends when that server ends it; an `ERROR` event becomes an `Err`
    /// carrying its reason (`Expired`/`Gone`: relist). Objects come without
    /// `metadata.managedFields`. Most callers want
    /// [`watcher`](crate::runtime::watcher::watcher) instead.
    pub async fn watch(&self, params: &WatchParams) -> Result<WatchStream<K>, ClientError> {
        let stream = self.client.watch_raw(self.resource()?, &self.namespace, params).await?;
        Ok(stream
            .map(|item| {
                let event = item?;
                match event.kind {
                    EventType::Added => Ok(WatchEvent::Added(watched(&event.json)?)),
                    EventType::Modified => Ok(WatchEvent::Modified(watched(&event.json)?)),
                    EventType::Deleted => Ok(WatchEvent::Deleted(watched(&event.json)?)),
                    EventType::Bookmark => Ok(WatchEvent::Bookmark(
                        skiff_api::meta::resource_version(&event.decode()?).unwrap_or_default().to_string(),
                    )),
                    EventType::Error => {
                        Err(ClientError::Api(ApiError::from_status(&event.decode()?).unwrap_or_else(|| {
                            ApiError::new(skiff_api::Reason::InternalError, "watch ERROR event without a Status")
                        })))
                    }
                }
            })
            .boxed())
    }
}

impl<K: Resource> ListWatch<K> for Api<K> {
    fn list(&self, params: ListParams) -> BoxFuture<'_, Result<ObjectList<K>, ClientError>> {
        async move { Api::list(self, &params).await }.boxed()
    }

    fn watch(&self, params: WatchParams) -> BoxFuture<'_, Result<WatchStream<K>, ClientError>> {
        async move { Api::watch(self, &params).await }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};

    use super::*;

    #[test]
    fn a_watched_object_is_decoded_without_its_managed_fields() {
        let json = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7",
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:nodeName": {}}}}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0}]}});
        let pod: Pod = watched(&serde_json::to_vec(&json).unwrap()).unwrap();
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("n1"));
        let statuses = pod.status.unwrap().container_statuses.unwrap();
        assert_eq!((statuses.len(), statuses.capacity()), (1, 1), "no spare room kept");
        assert!(watched::<Pod>(b"{not json").is_err());
    }

    /// A type the catalog does not hold.
    #[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
    struct Widget {
        metadata: ObjectMeta,
    }

    impl k8s_openapi::Resource for Widget {
        const API_VERSION: &'static str = "example.com/v1";
        const GROUP: &'static str = "example.com";
        const KIND: &'static str = "Widget";
        const VERSION: &'static str = "v1";
        const URL_PATH_SEGMENT: &'static str = "widgets";
        type Scope = k8s_openapi::NamespaceResourceScope;
    }

    impl k8s_openapi::Metadata for Widget {
        type Ty = ObjectMeta;
        fn metadata(&self) -> &ObjectMeta {
            &self.metadata
        }
        fn metadata_mut(&mut self) -> &mut ObjectMeta {
            &mut self.metadata
        }
    }

    #[tokio::test]
    async fn an_api_finds_its_resource_from_the_type() {
        let client = Client::new(&["127.0.0.1:1"]).unwrap();
        assert_eq!(Api::<Pod>::namespaced(client.clone(), "default").resource().unwrap().plural, "pods");
        assert!(!Api::<Node>::all(client).resource().unwrap().namespaced);
    }

    #[tokio::test]
    async fn an_api_of_an_unserved_type_fails_every_call_without_panicking() {
        let api = Api::<Widget>::all(Client::new(&["127.0.0.1:1"]).unwrap());
        let e = api.get("w").await.unwrap_err();
        assert!(matches!(e, ClientError::UnknownKind { ref kind, .. } if kind == "Widget"), "{e:?}");
        assert_eq!(e.reason(), None);
    }
}
