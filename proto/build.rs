//! Compiles Skiff's `.proto` files with the pure-Rust `protox` compiler (no
//! `protoc` binary required) and generates prost messages plus tonic
//! clients/servers from the resulting `FileDescriptorSet`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "etcd/mvccpb/kv.proto",
    "etcd/etcdserverpb/rpc.proto",
    "etcd/authpb/auth.proto",
    "etcd/etcdserverpb/auth_rpc.proto",
    "etcd/v3lockpb/v3lock.proto",
    "etcd/v3electionpb/v3election.proto",
    "skiff/peer.proto",
    "skiff/control.proto",
    "skiff/resource.proto",
    "skiff/bootstrap.proto",
    "cri/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");

    let include = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| include.join(p)).collect();

    let fds =
        protox::compile(&files, [&include]).map_err(|e| format!("protox failed to compile Skiff protos: {e:?}"))?;

    tonic_build::configure().build_server(true).build_client(true).compile_fds(fds)?;

    Ok(())
}
