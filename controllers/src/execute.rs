//! Carries a reconcile's [`Action`]s out against the API, in order,
//! stopping at the first failure (the runner requeues the key with
//! back-off, and the next reconcile starts again from the caches). A run of
//! consecutive creates goes in slow-start batches and a run of consecutive
//! deletes all at once (at most [`DELETES_IN_FLIGHT`] in flight): one at a
//! time, a namespace of 10,000 objects took a minute to empty.
//!
//! Two outcomes are not failures: deleting an object that is already gone,
//! and creating an Event. Events go through [`Recorder`], which drops them
//! once one object has had its burst, as client-go's spam filter does, so
//! a controller failing in a loop cannot flood the store with Events.

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::resources::{self, ResourceInfo};
use skiff_api::{meta, Reason};
use skiff_client::resources::DeleteParams;
use skiff_client::{Client, ClientError};

use crate::action::Action;
pub use skiff_client::runtime::events::{event_for, Recorder};

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    #[error("{api_version}/{kind} is not a resource this cluster serves")]
    UnknownKind { api_version: String, kind: String },
    #[error("{verb} {kind} {namespace}/{name}: {source}")]
    Api {
        verb: &'static str,
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: Box<ClientError>,
    },
}

impl ExecuteError {
    /// A Conflict means the cache was stale: retry soon, it is not an error
    /// worth an Event.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ExecuteError::Api { source, .. } if source.is(Reason::Conflict))
    }
}

/// What carrying out one action produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Objects created, in the order their actions came.
    pub created: Vec<Value>,
}

fn info_of(obj: &Value) -> Result<&'static ResourceInfo, ExecuteError> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    info_named(api_version, kind)
}

fn info_named(api_version: &str, kind: &str) -> Result<&'static ResourceInfo, ExecuteError> {
    resources::by_kind(api_version, kind)
        .ok_or_else(|| ExecuteError::UnknownKind { api_version: api_version.into(), kind: kind.into() })
}

/// Where the API serves kinds the built-in catalog lacks: custom
/// resources, found by the definition serving an `apiVersion` and `kind`.
pub trait CustomKinds: Sync {
    /// The API group and plural serving `api_version` and `kind`, if a
    /// custom resource does.
    fn serving(&self, api_version: &str, kind: &str) -> Option<(String, String)>;
}

/// Built-in kinds only.
pub struct BuiltinOnly;

impl CustomKinds for BuiltinOnly {
    fn serving(&self, _: &str, _: &str) -> Option<(String, String)> {
        None
    }
}

/// The resource an action's `apiVersion` and `kind` name.
enum Target {
    Builtin(&'static ResourceInfo),
    Custom { group: String, plural: String },
}

fn target(api_version: &str, kind: &str, custom: &dyn CustomKinds) -> Result<Target, ExecuteError> {
    match info_named(api_version, kind) {
        Ok(info) => Ok(Target::Builtin(info)),
        Err(unknown) => {
            custom.serving(api_version, kind).map(|(group, plural)| Target::Custom { group, plural }).ok_or(unknown)
        }
    }
}

fn failed<'a>(verb: &'static str, obj: &'a Value) -> impl FnOnce(ClientError) -> ExecuteError + 'a {
    move |source| ExecuteError::Api {
        verb,
        kind: obj["kind"].as_str().unwrap_or_default().to_string(),
        namespace: meta::namespace(obj).unwrap_or_default().to_string(),
        name: meta::name(obj).or_else(|| meta::generate_name(obj)).unwrap_or_default().to_string(),
        source: Box::new(source),
    }
}

/// A run that stopped at a failure.
#[derive(Debug)]
pub struct Failed {
    pub error: ExecuteError,
    /// The actions not carried out: the failed ones and every one after
    /// them (a controller's expectations stop waiting for these).
    pub skipped: Vec<Action>,
}

/// The first batch of a run of creates; each batch after a successful one is
/// twice as large (Kubernetes' `slowStartBatch`), so a failing create (a
/// quota, a bad template) costs one request, not hundreds.
const SLOW_START_BATCH: usize = 1;
/// Creates in flight at once within a batch.
const CREATES_IN_FLIGHT: usize = 128;

/// Deletes in flight at once within a run of consecutive deletes.
const DELETES_IN_FLIGHT: usize = 64;

fn is_delete(action: &Action) -> bool {
    matches!(action, Action::Delete { .. } | Action::ForceDelete { .. })
}

/// Carries out `actions` in order; the first failure ends the run. A run of
/// consecutive creates goes in slow-start batches, each batch's creates
/// concurrently; a run of consecutive deletes goes concurrently. Patches
/// and deletes of custom objects go to the resource `custom` names.
pub async fn execute(
    client: &Client,
    recorder: &Recorder,
    custom: &dyn CustomKinds,
    actions: Vec<Action>,
) -> Result<Outcome, Failed> {
    let mut outcome = Outcome::default();
    let mut rest = actions.into_iter().peekable();
    while let Some(action) = rest.next() {
        if is_delete(&action) {
            let mut deletes = vec![action];
            while let Some(next) = rest.next_if(is_delete) {
                deletes.push(next);
            }
            if let Err(mut failed) = delete_together(client, recorder, custom, deletes).await {
                failed.skipped.extend(rest);
                return Err(failed);
            }
            continue;
        }
        if matches!(action, Action::Create(_)) {
            let mut creates = vec![action];
            while let Some(next) = rest.next_if(|a| matches!(a, Action::Create(_))) {
                creates.push(next);
            }
            if let Err(mut failed) = create_in_batches(client, creates, &mut outcome).await {
                failed.skipped.extend(rest);
                return Err(failed);
            }
            continue;
        }
        if let Err(error) = execute_one(client, recorder, custom, &action).await {
            let mut skipped = vec![action];
            skipped.extend(rest);
            return Err(Failed { error, skipped });
        }
    }
    Ok(outcome)
}

/// Deletes concurrently; on failure the failed deletes are the skipped ones
/// (the others are done), the first failure in action order the error.
async fn delete_together(
    client: &Client,
    recorder: &Recorder,
    custom: &dyn CustomKinds,
    deletes: Vec<Action>,
) -> Result<(), Failed> {
    let results: Vec<(Action, Result<(), ExecuteError>)> = futures::stream::iter(deletes)
        .map(|action| async move {
            let result = execute_one(client, recorder, custom, &action).await;
            (action, result)
        })
        .buffered(DELETES_IN_FLIGHT)
        .collect()
        .await;
    let mut error = None;
    let mut skipped = Vec::new();
    for (action, result) in results {
        if let Err(e) = result {
            error.get_or_insert(e);
            skipped.push(action);
        }
    }
    match error {
        Some(error) => Err(Failed { error, skipped }),
        None => Ok(()),
    }
}

async fn create_in_batches(client: &Client, creates: Vec<Action>, outcome: &mut Outcome) -> Result<(), Failed> {
    let mut pending = creates.into_iter();
    let mut batch_size = SLOW_START_BATCH;
    loop {
        let batch: Vec<Action> = pending.by_ref().take(batch_size).collect();
        if batch.is_empty() {
            return Ok(());
        }
        let results: Vec<(Action, Result<Value, ExecuteError>)> = futures::stream::iter(batch)
            .map(|action| async move {
                let result = match &action {
                    Action::Create(obj) => create(client, obj).await,
                    _ => unreachable!("only creates are batched"),
                };
                (action, result)
            })
            .buffered(CREATES_IN_FLIGHT)
            .collect()
            .await;
        let mut error = None;
        let mut skipped = Vec::new();
        for (action, result) in results {
            match result {
                Ok(created) => outcome.created.push(created),
                Err(e) => {
                    error.get_or_insert(e);
                    skipped.push(action);
                }
            }
        }
        if let Some(error) = error {
            skipped.extend(pending);
            return Err(Failed { error, skipped });
        }
        batch_size *= 2;
    }
}

async fn create(client: &Client, obj: &Value) -> Result<Value, ExecuteError> {
    let info = info_of(obj)?;
    let ns = meta::namespace(obj).unwrap_or_default();
    client.create(info, ns, obj).await.map_err(failed("create", obj))
}

async fn execute_one(
    client: &Client,
    recorder: &Recorder,
    custom: &dyn CustomKinds,
    action: &Action,
) -> Result<(), ExecuteError> {
    match action {
        Action::Create(obj) => {
            create(client, obj).await?;
        }
        Action::Update(obj) => {
            client.update(info_of(obj)?, obj).await.map_err(failed("update", obj))?;
        }
        Action::UpdateStatus(obj) => {
            client.update_status(info_of(obj)?, obj).await.map_err(failed("update status of", obj))?;
        }
        Action::Finalize(namespace) => {
            let info = info_of(namespace)?;
            client.update_subresource(info, namespace, "finalize").await.map_err(failed("finalize", namespace))?;
        }
        Action::Patch { api_version, kind, namespace, name, patch } => {
            let patched = match target(api_version, kind, custom)? {
                Target::Builtin(info) => client.patch(info, namespace, name, "merge", patch, "").await,
                Target::Custom { group, plural } => {
                    client.patch_of(&group, &plural, namespace, name, "merge", patch).await
                }
            };
            let about = json!({"kind": kind, "metadata": {"namespace": namespace, "name": name}});
            patched.map_err(failed("patch", &about))?;
        }
        Action::Delete { api_version, kind, namespace, name, uid, propagation } => {
            let params = DeleteParams {
                uid: uid.clone().unwrap_or_default(),
                propagation_policy: propagation.clone().unwrap_or_default(),
                ..Default::default()
            };
            delete(client, custom, api_version, kind, namespace, name, &params).await?;
        }
        Action::ForceDelete { api_version, kind, namespace, name, uid } => {
            let params = DeleteParams {
                uid: uid.clone().unwrap_or_default(),
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            delete(client, custom, api_version, kind, namespace, name, &params).await?;
        }
        Action::Event { regarding, type_, reason, message } => {
            recorder.record(client, regarding, type_, reason, message).await;
        }
    }
    Ok(())
}

/// Deletes one object; one already gone (or replaced by a newer object of
/// that name, when the uid is a precondition) counts as deleted.
async fn delete(
    client: &Client,
    custom: &dyn CustomKinds,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    params: &DeleteParams,
) -> Result<(), ExecuteError> {
    let deleted = match target(api_version, kind, custom)? {
        Target::Builtin(info) => client.delete(info, namespace, name, params).await,
        Target::Custom { group, plural } => client.delete_of(&group, &plural, namespace, name, params).await,
    };
    match deleted {
        Err(e) if e.is(Reason::NotFound) || (!params.uid.is_empty() && e.is(Reason::Conflict)) => Ok(()),
        Err(e) => {
            let target = json!({"kind": kind, "metadata": {"namespace": namespace, "name": name}});
            Err(failed("delete", &target)(e))
        }
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delete_of(kind: &str, name: &str) -> Action {
        Action::Delete {
            api_version: "widgets/v1".into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: None,
            propagation: None,
        }
    }

    #[tokio::test]
    async fn a_failed_delete_in_a_run_skips_it_and_everything_after_the_run() {
        // Unknown kinds fail before any request, so no server is needed.
        let client = Client::new(&["127.0.0.1:1"]).unwrap();
        let recorder = Recorder::new("test");
        let update = Action::Update(json!({"apiVersion": "widgets/v1", "kind": "Widget"}));
        let actions = vec![delete_of("Widget", "a"), delete_of("Widget", "b"), update];
        let failed = execute(&client, &recorder, &BuiltinOnly, actions).await.unwrap_err();
        assert!(matches!(failed.error, ExecuteError::UnknownKind { .. }));
        let skipped: Vec<bool> = failed.skipped.iter().map(is_delete).collect();
        assert_eq!(skipped, vec![true, true, false], "both deletes failed, the update never ran");
    }

    #[test]
    fn deletes_and_force_deletes_run_together_but_nothing_else_does() {
        let force = Action::ForceDelete {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "ns".into(),
            name: "p".into(),
            uid: None,
        };
        assert!(is_delete(&delete_of("Pod", "p")));
        assert!(is_delete(&force));
        assert!(!is_delete(&Action::Create(json!({}))));
        assert!(!is_delete(&Action::Update(json!({}))));
    }

    #[test]
    fn unknown_kinds_are_refused_before_any_request() {
        let err = info_of(&json!({"apiVersion": "widgets/v1", "kind": "Widget"})).unwrap_err();
        assert!(err.to_string().contains("widgets/v1/Widget"));
    }
}
