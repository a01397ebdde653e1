//! Kubernetes API machinery for Skiff, shared by the apiserver, the clients
//! and `skiffctl`. Pure functions on objects; no I/O, no storage.
//!
//! # Layout
//! - [`resources`]: the catalog of served resources (names, scope, subresources).
//! - [`meta`]: reading and writing `metadata` on an object's JSON.
//! - [`defaults`]: defaulting, as Kubernetes does for the fields Skiff uses.
//! - [`validation`] and [`field`]: validation with field paths.
//! - [`selector`]: label and field selectors: parsing and matching.
//! - [`table`]: the columns `get` shows per kind (`meta.k8s.io/v1` Table).
//! - [`status`]: errors as Kubernetes `Status` objects.
//! - [`patch`]: merge and strategic merge patches.
//! - [`protobuf`]: `application/vnd.kubernetes.protobuf` request bodies decoded to JSON.

#![forbid(unsafe_code)]

pub mod defaults;
pub mod field;
pub mod history;
pub mod meta;
pub mod patch;
pub mod protobuf;
pub mod resources;
pub mod selector;
pub mod status;
pub mod table;
pub mod validation;

pub use field::FieldError;
pub use resources::{Kind, ResourceInfo};
pub use status::{ApiError, Reason};
