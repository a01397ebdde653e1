//! Skiff's client runtime, modelled on client-go and kube-runtime.
//!
//! # Layout
//! - [`resources`]: the resource API (get, list, create, update, patch,
//!   delete, watch, history) against any apiserver, failing over between
//!   endpoints, with errors as Kubernetes `Status` reasons.

#![forbid(unsafe_code)]

pub mod resources;

pub use resources::{Client, ClientError};
