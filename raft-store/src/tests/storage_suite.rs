//! openraft's storage conformance suite on Skiff's RocksDB log store and
//! state machine.

use crate::log_store::LogStore;
use crate::state_machine::StateMachine;
use crate::types::{StorageError, TypeConfig};

struct Builder;

impl openraft::testing::StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("raft-log"), 0).expect("open log store");
        let sm = StateMachine::open(dir.path()).expect("open state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    if let Err(e) = openraft::testing::Suite::test_all(Builder) {
        panic!("storage suite failed: {e}");
    }
}
