//! The resources CustomResourceDefinitions add, as this member knows them.
//!
//! The definitions are objects in the store like any other; every member
//! builds the resources they serve from what it has applied. A request for
//! a resource the member does not know re-reads the definitions (cheap: a
//! local range over them, skipped when the store has not moved), and once
//! more after catching up with the leader, so a definition created through
//! another master is served here as soon as a client could know of it.
//!
//! A definition's resources are built once per change of it: their
//! [`ResourceInfo`]s hold `'static` strings, leaked on each rebuild (a few
//! hundred bytes plus the schema per write of a CRD; CRDs change rarely).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use skiff_api::resources::{self, Kind, ResourceInfo};
use skiff_api::{custom, ApiError};

use crate::storage::{prefix_end, Consistency, ObjectStore};

#[derive(Default)]
struct Known {
    /// The store revision the definitions were last read at.
    read_at: i64,
    /// By definition name: its mod revision and its resources.
    by_definition: BTreeMap<String, (i64, Vec<&'static ResourceInfo>)>,
}

/// The custom resources this member serves.
#[derive(Clone, Default)]
pub struct CustomResources {
    known: Arc<Mutex<Known>>,
}

impl CustomResources {
    /// Every custom resource, after reading the definitions if the store
    /// moved since they were last read.
    pub async fn all(&self, objects: &ObjectStore) -> Result<Vec<&'static ResourceInfo>, ApiError> {
        self.refresh(objects).await?;
        let known = self.known.lock().expect("custom resources lock");
        Ok(known.by_definition.values().flat_map(|(_, infos)| infos.iter().copied()).collect())
    }

    /// The resource served at `group`/`version` under `plural`: built-in or
    /// custom. An unknown one is looked for again after catching up with
    /// the leader.
    pub async fn find(
        &self,
        objects: &ObjectStore,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Option<&'static ResourceInfo>, ApiError> {
        if let Some(info) = resources::by_plural(Some(group), plural) {
            return Ok((info.version == version).then_some(info));
        }
        if !group.contains('.') {
            // Custom groups have a dot; nothing else can be one.
            return Ok(None);
        }
        let matches = |infos: Vec<&'static ResourceInfo>| {
            infos.into_iter().find(|r| r.group == group && r.version == version && r.plural == plural)
        };
        if let Some(info) = matches(self.all(objects).await?) {
            return Ok(Some(info));
        }
        objects.prepare_read(Consistency::Linearizable).await?;
        Ok(matches(self.all(objects).await?))
    }

    async fn refresh(&self, objects: &ObjectStore) -> Result<(), ApiError> {
        let now = objects.store.revision();
        if self.known.lock().expect("custom resources lock").read_at == now && now > 0 {
            return Ok(());
        }
        let prefix = resources::of(Kind::CustomResourceDefinition).prefix();
        let page = objects.range(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), 0, 0).await?;
        let mut known = self.known.lock().expect("custom resources lock");
        let mut next = BTreeMap::new();
        for stored in page.items {
            let name = String::from_utf8_lossy(&stored.key[prefix.len()..]).into_owned();
            let infos = match known.by_definition.remove(&name) {
                Some((revision, infos)) if revision == stored.mod_revision => infos,
                _ => match stored.decode() {
                    Ok(crd) => build(&crd),
                    Err(e) => {
                        tracing::warn!(definition = %name, error = %e, "skipping an unreadable CustomResourceDefinition");
                        continue;
                    }
                },
            };
            next.insert(name, (stored.mod_revision, infos));
        }
        known.by_definition = next;
        known.read_at = page.revision;
        Ok(())
    }
}

fn build(crd: &Value) -> Vec<&'static ResourceInfo> {
    custom::resources_of(crd).into_iter().map(|r| &*Box::leak(Box::new(r))).collect()
}
