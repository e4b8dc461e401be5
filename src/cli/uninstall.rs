//! `devgate uninstall-host`: takes devgate off a host mounted at `--root`, in the order
//! that never leaves a runtime naming a file or program that is gone. containerd keeps
//! naming the base spec (its config is the operator's) and reads it only at start, so:
//! first the spec loses its hooks and the oci-hooks files go; once the runtime has
//! restarted, `--programs` removes the programs.

use super::conffile::read_opt;
use super::crun_wrap;
use super::enable::{self, Changes};
use super::hooks_config::{
    absolute, files, Runtime, Target, CONTAINERD_BASE_SPEC_NAME, HOST_HOOKS_DIR,
    OCI_HOOKS_FILE_NAME, PACKAGE_HOOKS_DIR,
};
use super::host_opts::{target_of, Opts};
use super::install::{base_spec, shared_files, under, BaseSpec, CONTAINERD_DIR, SHARE_DIR};
use super::runtime_confs::named_by_runtime_config;
use super::wrapper_config;
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use serde_json::Value;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

const USAGE: &str = "usage: devgate uninstall-host --root DIR [--prefix DIR] [--hooks-dir DIR] \
[--restart] [--programs]";

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

/// The programs install-host lays for `target`, as the host names them.
fn host_programs(target: &Target) -> [PathBuf; 3] {
    [
        target.hook.clone(),
        wrapper_config::wrapper_path(target),
        target.bin.clone(),
    ]
}

/// [`host_programs`], under `root`.
fn programs(root: &Path, target: &Target) -> Vec<PathBuf> {
    host_programs(target)
        .iter()
        .map(|p| under(root, p))
        .collect()
}

/// Step one: the spec loses its hooks, the oci-hooks files go. Returns whether the
/// programs may go once the runtime restarts (not where an edited spec may name them).
fn unhook(root: &Path, o: &Opts, target: &Target, changes: &mut Changes) -> Result<bool> {
    let ours = files(Runtime::Containerd, target)?;
    let ours = ours
        .first()
        .map(|f| f.content.as_bytes())
        .unwrap_or_default();
    let spec = base_spec(root, CONTAINERD_BASE_SPEC_NAME);
    changes.keep(&spec.path)?;
    changes.keep(&spec.record)?;
    let host_spec = Path::new(CONTAINERD_DIR).join(CONTAINERD_BASE_SPEC_NAME);
    let named = named_by_runtime_config(root, &[host_spec], &[]).is_some();
    let free = match spec_state(&spec, ours)? {
        SpecState::Absent => true,
        // No config names it any more: the node is as it was before devgate.
        SpecState::Hookless | SpecState::Ours(_) if !named => {
            remove(&spec.path)?;
            remove(&spec.record)?;
            true
        }
        SpecState::Hookless => true,
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

/// Step two: the programs, where no runtime config names one, and the snippets beside them.
fn remove_programs(root: &Path, target: &Target) -> Result<()> {
    if let Some((file, prog)) = named_by_runtime_config(root, &host_programs(target), &[]) {
        return Err(Error::invalid(
            "--programs",
            format!(
                "{} names {}: every start through that runtime would fail without it; take it \
                 out, restart the runtime, then rerun",
                file.display(),
                prog.display()
            ),
        ));
    }
    for p in programs(root, target) {
        remove(&p)?;
    }
    // The snippets install-host laid beside them, and their directories where empty.
    for (dir, files) in shared_files(target)? {
        let dir = under(root, &dir);
        for f in files {
            remove(&dir.join(&f.name))?;
        }
        let _ = fs::remove_dir(&dir);
    }
    let _ = fs::remove_dir(under(root, Path::new(SHARE_DIR)));
    Ok(())
}

pub(super) fn uninstall_host(o: &Opts) -> Result<()> {
    let root = checked_root(o)?;
    let target = target_of(o, "/usr/local")?;
    // The wrapper's drop-ins first (podman and CRI-O run crun itself again), then
    // containerd's config: it stops naming the spec, which then goes too.
    let mut crio_changes = Changes::default();
    crun_wrap::disable(root, &mut crio_changes)?;
    let mut changes = Changes::default();
    enable::edit_config(root, None, None, &mut changes)?;
    // What the running containerd and CRI-O read at start, changed by this run.
    let runtimes_changed = changes.any_changed()? || crio_changes.any_changed()?;
    let free = unhook(root, o, &target, &mut changes)?;
    if o.restart {
        enable::restart(root, &changes, "devgate is off")?;
        crun_wrap::restart_crio(root, &crio_changes)?;
    } else {
        enable::say_restart_needed(&changes)?;
        crun_wrap::say_restart_needed(&crio_changes)?;
    }
    if !o.programs {
        if free {
            say!(
                "devgate: once the runtime has restarted, rerun with --programs to remove the programs"
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
    // Until they restart, containerd and CRI-O run the config this run took devgate out
    // of: its base spec's hooks, its runtime wrapper. Removed now, every container start
    // through them would fail.
    if runtimes_changed && !o.restart {
        return Err(Error::invalid(
            "--programs",
            "containerd or CRI-O still runs devgate's programs from the config this run \
             changed: restart it (or rerun with --restart), then rerun with --programs",
        ));
    }
    remove_programs(root, &target)?;
    say!("devgate: the config and quarantine marks under /etc/devgate and /var/lib/devgate stay");
    Ok(())
}

/// The host root uninstall-host takes devgate off, once the options are its own and a
/// host asked to restart containerd can.
fn checked_root(o: &Opts) -> Result<&Path> {
    if o.runtime.is_some() || o.bin.is_some() || o.out.is_some() || o.wrapper || o.enable {
        return Err(Error::Usage(format!(
            "--runtime, --bin, --out, --wrapper and --enable are not uninstall-host's options; \
             {USAGE}"
        )));
    }
    let root = enable::host_root(o, USAGE)?;
    enable::check_restart(o, root)?;
    Ok(root)
}
