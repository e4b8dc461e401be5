//! Which program the wrapper runs: `runtime.path` from devgate's config, a bare name
//! looked up in fixed system directories (never the caller's PATH: the wrapper runs as
//! root for whoever invokes it), and checked so that root never executes a file someone
//! else could have written, nor devgate itself in a loop.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::fsutil::program::{self, is_executable_file};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a bare `runtime.path` is looked up, in this order (the PATH devgate's hooks get).
pub const SEARCH_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

pub use crate::fsutil::program::WRAPPED_ENV;

/// `runtime.path` of `config`, resolved. An error names the config file the path came
/// from: that file is where the operator fixes it.
pub fn resolve_configured(config: &Config) -> Result<PathBuf> {
    resolve(&config.runtime.path).map_err(|e| match &config.source {
        Some(file) => Error::invalid(format!("config {}", file.display()), e.to_string()),
        None => e,
    })
}

pub fn resolve(configured: &Path) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = if configured.is_absolute() {
        vec![configured.to_path_buf()]
    } else {
        SEARCH_DIRS
            .iter()
            .map(|d| Path::new(d).join(configured))
            .collect()
    };
    for c in &candidates {
        // The runtime's own path may be a symlink (alternatives); its target is checked.
        let Ok(meta) = std::fs::metadata(c) else {
            continue;
        };
        if !is_executable_file(&meta) {
            continue;
        }
        check(c, &meta)?;
        return Ok(c.clone());
    }
    Err(Error::invalid(
        "runtime.path",
        if configured.is_absolute() {
            format!("{} is not an executable file", configured.display())
        } else {
            format!(
                "no executable {} in {}",
                configured.display(),
                SEARCH_DIRS.join(":")
            )
        },
    ))
}

/// Whether the runtime at `real` may run devgate's wrapper again, so that it needs the loop
/// mark ([`WRAPPED_ENV`]): anything but runc or crun themselves (another wrapper such as
/// NVIDIA's, a script, also one named `runc`). runc passes its environment to every hook
/// entry that sets no `env`, so the mark goes only where a loop can be; a link to devgate
/// under either name is refused by inode in [`resolve`].
pub fn may_lead_back(real: &Path) -> bool {
    let named = real.file_name().is_some_and(|n| n == "runc" || n == "crun");
    !(named && is_elf(real))
}

/// Whether `path` is a compiled program (ELF), as runc and crun are; a script is not.
fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

fn check(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    // This program, or the devgate beside it (devgate-runtime's): either would start the
    // wrapper again instead of a runtime.
    let selves = [
        Some(PathBuf::from("/proc/self/exe")),
        program::beside(program::DEVGATE).ok(),
    ];
    for me in selves
        .iter()
        .flatten()
        .filter_map(|p| std::fs::metadata(p).ok())
    {
        if (me.dev(), me.ino()) == (meta.dev(), meta.ino()) {
            return Err(Error::invalid(
                "runtime.path",
                format!(
                    "{} is devgate itself; name the runtime devgate runs (runc, crun, or \
                     another wrapper)",
                    path.display()
                ),
            ));
        }
    }
    program::check_trusted(path, meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_runc_or_crun_themselves_go_without_the_loop_mark() {
        let dir = crate::fsutil::tests::tempdir("may-lead-back");
        // A compiled program named runc (a copy of the test binary stands in) goes without.
        let elf = dir.join("runc");
        fs::copy(std::env::current_exe().unwrap(), &elf).unwrap();
        assert!(!may_lead_back(&elf));
        // A script named crun may run devgate-runtime again: it gets the mark.
        let script = dir.join("crun");
        fs::write(&script, "#!/bin/sh\nexec devgate-runtime \"$@\"\n").unwrap();
        assert!(may_lead_back(&script));
        assert!(may_lead_back(Path::new(
            "/usr/bin/nvidia-container-runtime"
        )));
        assert!(may_lead_back(Path::new("/opt/bin/runc-wrapper")));
        // One that cannot be read is taken for a possible loop.
        assert!(may_lead_back(&dir.join("sub/runc")));
    }

    #[test]
    fn bare_name_is_found_in_system_dirs_only() {
        let sh = resolve(Path::new("sh")).unwrap();
        assert!(SEARCH_DIRS.iter().any(|d| sh.starts_with(d)), "{sh:?}");
        let e = resolve(Path::new("devgate-no-such-runtime"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no executable devgate-no-such-runtime in /usr/local/sbin:"),
            "{e}"
        );
    }

    #[test]
    fn an_unusable_runtime_path_names_its_config_file() {
        let c = Config::parse(
            br#"{"runtime": {"path": "devgate-no-such-runtime"}}"#,
            Path::new("/etc/devgate/config.json"),
        )
        .unwrap();
        let e = resolve_configured(&c).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "config /etc/devgate/config.json: runtime.path: no executable \
                 devgate-no-such-runtime in /usr/local/sbin:"
            ),
            "{e}"
        );
        // the built-in default (no file) says only the key
        let d = Config {
            runtime: crate::config::RuntimeConfig {
                path: "devgate-no-such-runtime".into(),
            },
            ..Config::default()
        };
        let e = resolve_configured(&d).unwrap_err().to_string();
        assert!(e.starts_with("runtime.path: no executable"), "{e}");
    }

    #[test]
    fn self_and_writable_files_are_refused() {
        let me = fs::read_link("/proc/self/exe").unwrap();
        let e = resolve(&me).unwrap_err().to_string();
        assert!(e.contains("is devgate itself"), "{e}");
        let d = std::env::temp_dir().join(format!("devgate-rt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let f = d.join("runc");
        fs::write(&f, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o777)).unwrap();
        let e = resolve(&f).unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(resolve(&f).unwrap(), f);
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        let e = resolve(&f).unwrap_err().to_string();
        assert!(e.contains("is not an executable file"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }
}
