//! Compiles the vendored Kubernetes `generated.proto` files (see
//! `proto/README.md`) into a `FileDescriptorSet` with the pure-Rust `protox`
//! compiler, for `src/protobuf.rs` to decode `application/vnd.kubernetes.protobuf`
//! request bodies with `prost-reflect`. No code is generated.

use std::path::PathBuf;

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

    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let include = root.join("proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("k8s_descriptors.bin");

    let mut compiler = protox::Compiler::new([&include])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS).map_err(|e| format!("protox failed to compile the Kubernetes protos: {e:?}"))?;
    std::fs::write(out, compiler.encode_file_descriptor_set())?;
    Ok(())
}
