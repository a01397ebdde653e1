//! Links the `skiff` binary with LLVM's linker and identical code folding:
//! the many monomorphized copies of generic code that compile to the same
//! machine code (serde, tokio's task harness, prost) are kept once. The
//! architecture issue holds `skiff` under 50 MB (tests/binaries.rs); with
//! the service proxy and cluster DNS in it, it was 50.3 MB, folded 49.5 MB.
//! Only the final link of that one binary changes; nothing is recompiled.
//! Without `ld.lld` (Debian's `lld`, which `make` installs) the default
//! linker is used and the binary is about 0.8 MB larger.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PATH");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let lld = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("ld.lld").is_file()));
    if linux && lld {
        println!("cargo:rustc-link-arg-bin=skiff=-fuse-ld=lld");
        println!("cargo:rustc-link-arg-bin=skiff=-Wl,--icf=all");
    } else {
        println!(
            "cargo:warning=ld.lld not found: `skiff` is linked without identical code folding (about 0.8 MB larger)"
        );
    }
}
