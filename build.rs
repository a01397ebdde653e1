//! Links the `skiff` binary with LLVM's linker, for two things it does that
//! the default link does not (the architecture issue holds `skiff` under
//! 50 MB, tests/binaries.rs):
//!
//! - identical code folding: the many monomorphized copies of generic code
//!   that compile to the same machine code (serde, tokio's task harness,
//!   prost) are kept once, 0.8 MB;
//! - packed relative relocations (`-z pack-relative-relocs`, LLD 15 and
//!   later): a position-independent executable carries one relocation per
//!   pointer in its data (vtables, string tables, the serde visitors'
//!   tables), 24 bytes each and 2.9 MB in all; packed as DT_RELR bitmaps
//!   they take a few kilobytes, and the loader applies them faster. The
//!   binary then needs glibc 2.36 or later (Debian 12, Ubuntu 22.10,
//!   RHEL 10), which the link records as a version it requires, so an
//!   older loader refuses it with that message instead of misbehaving.
//!
//! Only the final link of that one binary changes; nothing is recompiled.
//! The linker is the newest LLD at hand: rustc's own `rust-lld` (which
//! rustc 1.90 and later link with on x86-64 Linux anyway), or an `ld.lld`
//! or `ld.lld-N` on `PATH` (`make` installs Debian's `lld`). Without one
//! the default linker is used and the binary is about 3.7 MB larger.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first LLD release with `-z pack-relative-relocs`.
const RELR_SINCE: u32 = 15;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=RUSTC");
    if std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux") {
        if let Some((dir, major)) = newest_lld() {
            // gcc looks for `ld.lld` under `-B` directories before `PATH`.
            println!("cargo:rustc-link-arg-bin=skiff=-B{}", dir.display());
            println!("cargo:rustc-link-arg-bin=skiff=-fuse-ld=lld");
            println!("cargo:rustc-link-arg-bin=skiff=-Wl,--icf=all");
            if major >= RELR_SINCE {
                println!("cargo:rustc-link-arg-bin=skiff=-Wl,-z,pack-relative-relocs");
            } else {
                println!(
                    "cargo:warning=ld.lld {major} cannot pack relocations (LLD {RELR_SINCE} can): `skiff` is about 2.9 MB larger"
                );
            }
            return;
        }
    }
    println!("cargo:warning=ld.lld not found: `skiff` is linked without code folding or packed relocations (about 3.7 MB larger)");
}

/// The directory holding the newest LLD as `ld.lld`, and its major version.
fn newest_lld() -> Option<(PathBuf, u32)> {
    let mut found: Vec<(PathBuf, u32)> = rust_lld().into_iter().collect();
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let versioned = name.strip_prefix("ld.lld-").is_some_and(|v| v.parse::<u32>().is_ok());
            if name != "ld.lld" && !versioned {
                continue;
            }
            // Debian's `ld.lld-16` links to `/usr/lib/llvm-16/bin/lld`,
            // whose directory has it as `ld.lld`, the name gcc runs.
            let Ok(real) = std::fs::canonicalize(entry.path()) else { continue };
            let Some(home) = real.parent().map(Path::to_path_buf) else { continue };
            if !home.join("ld.lld").is_file() {
                continue;
            }
            if let Some(major) = major_version(&home.join("ld.lld")) {
                found.push((home, major));
            }
        }
    }
    found.into_iter().max_by_key(|(_, major)| *major)
}

/// rustc's own LLD: `gcc-ld/ld.lld` in the target's tools runs `rust-lld`
/// beside it.
fn rust_lld() -> Option<(PathBuf, u32)> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = Command::new(rustc).args(["--print", "sysroot"]).output().ok()?;
    let sysroot = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let tools = sysroot.join("lib/rustlib").join(std::env::var("TARGET").ok()?).join("bin");
    let gcc_ld = tools.join("gcc-ld");
    if !gcc_ld.join("ld.lld").is_file() {
        return None;
    }
    let out = Command::new(tools.join("rust-lld")).args(["-flavor", "gnu", "--version"]).output().ok()?;
    Some((gcc_ld, parse_major(&String::from_utf8_lossy(&out.stdout))?))
}

/// `ld.lld --version` prints e.g. "Debian LLD 16.0.6 (compatible with GNU linkers)".
fn major_version(lld: &Path) -> Option<u32> {
    let out = Command::new(lld).arg("--version").output().ok()?;
    parse_major(&String::from_utf8_lossy(&out.stdout))
}

fn parse_major(text: &str) -> Option<u32> {
    let after = text.split("LLD ").nth(1)?;
    after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}
