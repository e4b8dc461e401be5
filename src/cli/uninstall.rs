//! `devgate uninstall-host`: takes devgate off a host mounted at `--root`, in the order
//! that never leaves a runtime naming a file or program that is gone. containerd keeps
//! naming the base spec (its config is the operator's) and reads it only at start, so:
//! first the spec loses its hooks and the oci-hooks files go; once the runtime has
//! restarted, `--programs` removes the programs.

use super::conffile::read_opt;
use super::hooks_config::{
    absolute, files, target_of, Opts, Runtime, Target, CONTAINERD_BASE_SPEC_NAME, HOST_HOOKS_DIR,
    OCI_HOOKS_FILE_NAME, PACKAGE_HOOKS_DIR,
};
use super::install::{base_spec, under, BaseSpec};
use super::wrapper_config;
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use serde_json::Value;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

const USAGE: &str =
    "usage: devgate uninstall-host --root DIR [--prefix DIR] [--hooks-dir DIR] [--programs]";

/// What the host's base spec is, for removal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SpecState {
    Absent,
    /// Without hooks: nothing in it runs devgate.
    Hookless,
    /// devgate's, with hooks (what install-host last laid, or what it would lay now).
    Ours(Value),
    /// The operator's edit: it may name the programs, so they stay.
    Edited,
}

fn spec_state(spec: &BaseSpec, ours: &[u8]) -> Result<SpecState> {
    let Some(current) = read_opt(&spec.path)? else {
        return Ok(SpecState::Absent);
    };
    let v: Value = serde_json::from_slice(&current)
        .map_err(|e| Error::invalid(spec.path.display().to_string(), e.to_string()))?;
    if v.get("hooks").is_none() {
        Ok(SpecState::Hookless)
    } else if spec.conffile().edited(ours)? {
        Ok(SpecState::Edited)
    } else {
        Ok(SpecState::Ours(v))
    }
}

/// `spec` without its hooks: containerd's default spec as devgate ships it, which a
/// containerd that names the file loads and runs nothing of devgate's with.
fn hookless(mut spec: Value) -> Vec<u8> {
    if let Some(o) = spec.as_object_mut() {
        o.remove("hooks");
    }
    let mut s = serde_json::to_string_pretty(&spec).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

fn remove(p: &Path) -> Result<()> {
    match fs::remove_file(p) {
        Ok(()) => {
            say!("devgate: removed {}", p.display());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", p, e)),
    }
}

/// The programs install-host lays for `target`, on the host.
fn programs(root: &Path, target: &Target) -> Vec<PathBuf> {
    [
        target.hook.clone(),
        wrapper_config::wrapper_path(target),
        target.bin.clone(),
    ]
    .iter()
    .map(|p| under(root, p))
    .collect()
}

/// Step one: the spec loses its hooks, the oci-hooks files go. Returns whether the
/// programs may go once the runtime restarts (not where an edited spec may name them).
fn unhook(root: &Path, o: &Opts, target: &Target) -> Result<bool> {
    let ours = files(Runtime::Containerd, target)?;
    let ours = ours
        .first()
        .map(|f| f.content.as_bytes())
        .unwrap_or_default();
    let spec = base_spec(root, CONTAINERD_BASE_SPEC_NAME);
    let free = match spec_state(&spec, ours)? {
        SpecState::Absent | SpecState::Hookless => true,
        SpecState::Ours(v) => {
            let bytes = hookless(v);
            write_atomic(&spec.path, &bytes, 0o644)?;
            spec.conffile().record(&bytes)?;
            say!(
                "devgate: {} has no hooks now; restart containerd where it names it",
                spec.path.display()
            );
            true
        }
        SpecState::Edited => {
            say!(
                "devgate: kept edited {}; devgate's programs stay while it may name them",
                spec.path.display()
            );
            false
        }
    };
    let dir = o
        .hooks_dir
        .as_deref()
        .unwrap_or(Path::new(PACKAGE_HOOKS_DIR));
    absolute("--hooks-dir", dir)?;
    for d in [dir, Path::new(HOST_HOOKS_DIR)] {
        remove(&under(root, d).join(OCI_HOOKS_FILE_NAME))?;
    }
    Ok(free)
}

pub(super) fn uninstall_host(o: &Opts) -> Result<()> {
    if o.runtime.is_some() || o.bin.is_some() || o.out.is_some() || o.wrapper {
        return Err(Error::Usage(format!(
            "--runtime, --bin, --out and --wrapper are not uninstall-host's options; {USAGE}"
        )));
    }
    let root = o
        .root
        .as_deref()
        .ok_or_else(|| Error::Usage(format!("--root is required; {USAGE}")))?;
    absolute("--root", root)?;
    let target = target_of(o, "/usr/local")?;
    let free = unhook(root, o, &target)?;
    if !o.programs {
        if free {
            say!(
                "devgate: after the runtime restarts, rerun with --programs to remove the programs"
            );
        }
        return Ok(());
    }
    if !free {
        return Err(Error::invalid(
            "--programs",
            "the base spec is an operator's edit that may name them; take devgate's hooks out of it first",
        ));
    }
    for p in programs(root, &target) {
        remove(&p)?;
    }
    say!("devgate: the config and quarantine marks under /etc/devgate and /var/lib/devgate stay");
    Ok(())
}
