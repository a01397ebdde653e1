//! Deployments, ReplicaSets, ReplicationControllers, DaemonSets and CronJobs: kinds whose only
//! rule of their own is that `metadata.generation` counts spec changes, so
//! their controllers can report which spec they have acted on
//! (`status.observedGeneration`).

use super::Strategy;

pub struct Workload;

impl Strategy for Workload {
    fn tracks_generation(&self) -> bool {
        true
    }
}
