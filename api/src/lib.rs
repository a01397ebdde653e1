//! Kubernetes API machinery for Skiff, shared by the apiserver, the clients
//! and `skiffctl`. Pure functions on objects; no I/O, no storage.
//!
//! # Layout
//! - [`resources`]: the catalog of served resources (names, scope, subresources).
//! - [`custom`]: custom resources from their CustomResourceDefinitions:
//!   schema pruning, defaulting and validation, printer columns.
//! - [`meta`]: reading and writing `metadata` on an object's JSON.
//! - [`defaults`]: defaulting, as Kubernetes does for the fields Skiff uses.
//! - [`validation`] and [`field`]: validation with field paths.
//! - [`selector`]: label and field selectors: parsing and matching.
//! - [`table`]: `meta.k8s.io/v1` Tables: per-kind printers (the columns
//!   `get` shows) and the generic Table building and text rendering.
//! - [`status`]: errors as Kubernetes `Status` objects, and the one mapping
//!   between their reasons and gRPC status codes.
//! - [`watch`]: the types of watch events, shared by server and clients.
//! - [`schemas`]: the built-in kinds' OpenAPI schemas with Kubernetes'
//!   list and map markers; [`structure`]: those markers compiled (and a
//!   custom resource's), as strategic merge and server-side apply read them.
//! - [`patch`]: merge and strategic merge patches.
//! - [`fieldpath`] and [`managed_fields`]: field sets in `FieldsV1` form, and
//!   field ownership (`metadata.managedFields`) and server-side apply on them.
//! - [`history`]: what changed between two stored versions of an object.
//! - [`protobuf`]: `application/vnd.kubernetes.protobuf` request bodies decoded to JSON.

#![forbid(unsafe_code)]
// The custom resource tests build whole CRDs with one `json!`.
#![recursion_limit = "256"]

pub mod custom;
pub mod defaults;
pub mod field;
pub mod fieldpath;
pub mod history;
pub mod managed_fields;
pub mod meta;
pub mod patch;
pub mod pod_refs;
pub mod protobuf;
pub mod quantity;
pub mod quota;
pub mod resources;
pub mod schemas;
pub mod selector;
pub mod status;
pub mod structure;
pub mod table;
pub mod validation;
pub mod watch;

pub use field::FieldError;
pub use resources::{Kind, ResourceInfo};
pub use status::{ApiError, Reason};
