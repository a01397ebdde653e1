//! A data directory's identity: which member and cluster it belongs to,
//! written once (durably) when the directory is created, so that a
//! directory is never used by another member or passed off as a wiped one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{StartError, StoreConfig};
use crate::state_machine::write_durably;
use crate::types::NodeId;

/// The identity of a data directory, written once when it is created.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataDirIdentity {
    pub id: NodeId,
    pub cluster_id: u64,
    /// Random per data directory; see [`MemberInfo::incarnation`](crate::types::MemberInfo::incarnation).
    pub incarnation: u64,
}

pub(super) const IDENTITY_FILE: &str = "skiff-member.json";
/// The one entry a new data dir may already hold: where a master that
/// joins with a token keeps the credentials it was handed, written before
/// its store opens.
pub const PKI_DIR: &str = "pki";

/// Cluster id of a bootstrapped cluster: every founding member derives the
/// same one from the founding membership (FNV-1a).
pub fn cluster_id_of(initial: &BTreeMap<NodeId, String>) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for (id, addr) in initial {
        for b in format!("{id}={addr},").bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

pub(super) fn load_identity(config: &StoreConfig) -> Result<(DataDirIdentity, bool), StartError> {
    let dir = &config.data_dir;
    let bad = |reason: String| StartError::DataDir { path: dir.clone(), reason };
    let io = |source: std::io::Error| StartError::DataDirIo { path: dir.clone(), source };
    let path = dir.join(IDENTITY_FILE);
    if path.exists() {
        let bytes = std::fs::read(&path).map_err(io)?;
        let identity: DataDirIdentity = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("{IDENTITY_FILE} is corrupt ({e}); refusing to touch this directory")))?;
        if identity.id != config.id {
            return Err(bad(format!("belongs to member {}, not member {}", identity.id, config.id)));
        }
        return Ok((identity, false));
    }
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io)?;
        let foreign = entries.find(|e| !e.as_ref().is_ok_and(|e| e.file_name() == PKI_DIR && e.path().is_dir()));
        if foreign.is_some() {
            return Err(bad(format!(
                "is not empty and has no {IDENTITY_FILE}: not a Skiff data directory; refusing to use it"
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    let cluster_id = if config.initial_cluster.is_empty() { 0 } else { cluster_id_of(&config.initial_cluster) };
    let identity = DataDirIdentity { id: config.id, cluster_id, incarnation: rand::random() };
    save_identity(dir, &identity).map_err(io)?;
    Ok((identity, true))
}

pub(super) fn save_identity(dir: &std::path::Path, identity: &DataDirIdentity) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(identity).map_err(std::io::Error::other)?;
    write_durably(&dir.join(IDENTITY_FILE), &bytes)
}
