//! Generates the k8s-openapi types' JSON schemas at build time, so the
//! `skiff` binary carries them as compressed data rather than as the
//! schemars code that builds them (about 3 MB of machine code, for
//! documents built once per process).
//!
//! Writes into `$OUT_DIR`
//! - `schemas.json.gz`: every schema the roots below reach, by name, with
//!   `$ref`s in the OpenAPI 3 form (`#/components/schemas/...`), gzipped;
//! - `schema_names.json`: the schema name of each root by
//!   `group/version/kind`, for `rest::openapi` to find a kind's schema by
//!   its `Resource` constants.
//!
//! The roots are every kind `rest::openapi` names (its `served_kind` and
//! `other_kinds`) and the two bodies every group accepts; a unit test there
//! checks that each of them has its schema.

use std::io::Write;

use k8s_openapi::api::{
    apps, authentication, authorization, autoscaling, batch, coordination, core, discovery, policy, rbac, scheduling,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as crds;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::gen::{SchemaGenerator, SchemaSettings};
use k8s_openapi::schemars::JsonSchema;
use k8s_openapi::Resource;
use serde_json::{Map, Value};

fn main() {
    let mut gen =
        SchemaGenerator::new(SchemaSettings::draft07().with(|s| s.definitions_path = "#/components/schemas/".into()));
    let mut names = Map::new();
    macro_rules! roots {
        ($($t:ty),* $(,)?) => {$(
            gen.subschema_for::<$t>();
            names.insert(
                format!("{}/{}/{}", <$t as Resource>::GROUP, <$t as Resource>::VERSION, <$t as Resource>::KIND),
                Value::String(<$t as JsonSchema>::schema_name()),
            );
        )*};
    }
    roots!(
        core::v1::Namespace,
        core::v1::Pod,
        core::v1::Node,
        core::v1::Service,
        core::v1::Endpoints,
        discovery::v1::EndpointSlice,
        core::v1::ConfigMap,
        core::v1::Secret,
        core::v1::ServiceAccount,
        core::v1::Event,
        coordination::v1::Lease,
        core::v1::ReplicationController,
        apps::v1::ReplicaSet,
        apps::v1::Deployment,
        apps::v1::DaemonSet,
        batch::v1::Job,
        batch::v1::CronJob,
        core::v1::ResourceQuota,
        core::v1::LimitRange,
        scheduling::v1::PriorityClass,
        policy::v1::PodDisruptionBudget,
        crds::CustomResourceDefinition,
        rbac::v1::Role,
        rbac::v1::ClusterRole,
        rbac::v1::RoleBinding,
        rbac::v1::ClusterRoleBinding,
        autoscaling::v1::Scale,
        core::v1::Binding,
        policy::v1::Eviction,
        authentication::v1::TokenRequest,
        authorization::v1::SelfSubjectAccessReview,
        authorization::v1::SelfSubjectRulesReview,
        authorization::v1::SubjectAccessReview,
        authentication::v1::SelfSubjectReview,
        meta::Status,
    );
    gen.subschema_for::<meta::DeleteOptions>();
    gen.subschema_for::<meta::Patch>();

    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let path = out_dir.join("schemas.json.gz");
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    serde_json::to_writer(&mut gz, gen.definitions()).expect("schemas serialize");
    gz.finish().and_then(|mut f| f.flush()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let path = out_dir.join("schema_names.json");
    std::fs::write(&path, Value::Object(names).to_string()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!("cargo::rerun-if-changed=build.rs");
}
