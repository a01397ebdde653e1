//! Deployments, ReplicaSets, ReplicationControllers, DaemonSets, CronJobs
//! and PodDisruptionBudgets: kinds whose only rule of their own is that
//! `metadata.generation` counts spec changes, so their controllers can
//! report which spec they have acted on (`status.observedGeneration`; the
//! eviction subresource refuses to trust a budget whose status is older).

use super::Strategy;

pub struct Workload;

impl Strategy for Workload {
    fn tracks_generation(&self) -> bool {
        true
    }
}
