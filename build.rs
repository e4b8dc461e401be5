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

// Start-up trick (docs/performance.md). Plain: libgcc_s.so.1 loaded.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !linux_gnu || static_archive("libgcc_eh.a").is_none() {
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
    static_programs(&out);
}

/// The programs linked statically: the runtime wrapper and the hook front, which every
/// container start runs and which hand what needs NVML to devgate.
const STATIC_PROGRAMS: [&str; 2] = ["devgate-runtime", "devgate-hook"];

/// Links `devgate-runtime` (src/runtime_main.rs) and `devgate-hook` (src/hook_main.rs) as
/// static PIEs, and only them: devgate itself loads NVML, which a static glibc program
/// cannot. Cargo links every binary of a package alike, so their links alone get
/// `-static-pie` and a search directory in which `libc.so`, `libm.so` and the rest are
/// linker scripts naming the static archives; rustc asks for those libraries by name after
/// `-Bdynamic`, and the scripts answer first. Where an archive is missing, both stay
/// dynamic: slower, and just as correct.
// Start-up trick (docs/performance.md). Plain: dynamic links.
fn static_programs(out: &std::path::Path) {
    let dir = out.join("static-runtime");
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for lib in ["c", "m", "pthread", "dl", "rt", "util"] {
        let Some(archive) = static_archive(&format!("lib{lib}.a")) else {
            println!(
                "cargo:warning=no static lib{lib}.a: devgate-runtime and devgate-hook are linked dynamically"
            );
            return;
        };
        let script = format!("INPUT({})\n", archive.display());
        if std::fs::write(dir.join(format!("lib{lib}.so")), script).is_err() {
            return;
        }
    }
    for bin in STATIC_PROGRAMS {
        println!("cargo:rustc-link-arg-bin={bin}=-static-pie");
        println!("cargo:rustc-link-arg-bin={bin}=-L{}", dir.display());
    }
}

/// The C compiler's path for a static archive, if it has one (it prints the bare name
/// back when it has none).
fn static_archive(name: &str) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(cc)
        .arg(format!("-print-file-name={name}"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|p| PathBuf::from(p.trim()))
        .filter(|p| p.is_absolute() && p.exists())
}
