//! Build-time data for the API machinery, so that no code is generated and
//! the binary carries data rather than the code that makes it:
//!
//! - `k8s_descriptors.bin`: the vendored Kubernetes `generated.proto` files
//!   (see `proto/README.md`) compiled into a `FileDescriptorSet` with the
//!   pure-Rust `protox` compiler, for `src/protobuf.rs` to decode
//!   `application/vnd.kubernetes.protobuf` request bodies with `prost-reflect`.
//! - `schemas.json.gz`: the k8s-openapi types' JSON schemas (their
//!   `schemars` schemas, about 3 MB of machine code had they been built at
//!   run time), every schema the roots below reach, by name, with `$ref`s in
//!   the OpenAPI 3 form (`#/components/schemas/...`), gzipped; and
//!   `schema_names.json`, the schema name of each root by
//!   `group/version/kind`. `src/schemas.rs` reads them back; the OpenAPI
//!   documents, strategic merge and server-side apply all start from them.
//!
//! The schema roots are every kind the apiserver serves or answers with and
//! the two bodies every group accepts; a unit test in `src/schemas.rs`
//! checks that each catalog kind has its schema.

use std::io::Write;
use std::path::PathBuf;

use k8s_openapi::api::{
    apps, authentication, authorization, autoscaling, batch, coordination, core, discovery, policy, rbac, scheduling,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as crds;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::gen::{SchemaGenerator, SchemaSettings};
use k8s_openapi::schemars::JsonSchema;
use k8s_openapi::Resource;
use serde_json::{Map, Value};

/// Every vendored file; imports are resolved against `proto/`.
const PROTOS: &[&str] = &[
    "k8s.io/apimachinery/pkg/runtime/generated.proto",
    "k8s.io/apimachinery/pkg/runtime/schema/generated.proto",
    "k8s.io/apimachinery/pkg/util/intstr/generated.proto",
    "k8s.io/apimachinery/pkg/api/resource/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/api/apps/v1/generated.proto",
    "k8s.io/api/batch/v1/generated.proto",
    "k8s.io/api/coordination/v1/generated.proto",
    "k8s.io/api/authorization/v1/generated.proto",
    "k8s.io/api/authentication/v1/generated.proto",
    "k8s.io/api/autoscaling/v1/generated.proto",
    "k8s.io/api/autoscaling/v2/generated.proto",
    "k8s.io/api/policy/v1/generated.proto",
    "k8s.io/api/rbac/v1/generated.proto",
    "k8s.io/api/networking/v1/generated.proto",
    "k8s.io/api/scheduling/v1/generated.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    descriptors()?;
    schemas();
    Ok(())
}

fn descriptors() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let include = root.join("proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("k8s_descriptors.bin");

    let mut compiler = protox::Compiler::new([&include])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS).map_err(|e| format!("protox failed to compile the Kubernetes protos: {e:?}"))?;
    std::fs::write(out, compiler.encode_file_descriptor_set())?;
    Ok(())
}

fn schemas() {
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

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let path = out_dir.join("schemas.json.gz");
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    serde_json::to_writer(&mut gz, gen.definitions()).expect("schemas serialize");
    gz.finish().and_then(|mut f| f.flush()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let path = out_dir.join("schema_names.json");
    std::fs::write(&path, Value::Object(names).to_string()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
