//! Tests of the store's internals against references: the MVCC engine
//! against an in-memory model, the Raft storage against openraft's suite.
//! They live inside the crate because the engine and the storage are not
//! part of its public interface.

mod cached_reads;
mod mvcc_model;
mod storage_suite;
