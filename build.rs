//! Links the unwinder statically (libgcc_eh) instead of loading libgcc_s.so.1.
//!
//! devgate starts on every container start, once as each hook and once more as the runtime
//! wrapper, so what its start costs is paid on every pod. Loading one more shared library
//! (open, map, relocate, a dozen page faults) was about a tenth of a millisecond of that on
//! the build machine, and devgate needs libgcc_s only for unwinding panics, which the static
//! archive gives just as well.
//!
//! Rust's std asks the linker for `-lgcc_s`. A linker script of that name, found first
//! because it sits in a directory on the link search path, hands it libgcc_eh.a instead.
//! Where the C compiler has no libgcc_eh.a (it prints the bare name back), nothing changes
//! and the binary loads libgcc_s as before.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !linux_gnu || !have_libgcc_eh() {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let dir = out.join("static-unwind");
    if std::fs::create_dir_all(&dir).is_err()
        || std::fs::write(dir.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n").is_err()
    {
        return;
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
}

/// Whether the C compiler that links devgate has the static unwinder.
fn have_libgcc_eh() -> bool {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|p| PathBuf::from(p.trim()).is_absolute())
}
