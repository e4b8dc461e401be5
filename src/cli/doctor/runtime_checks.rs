//! doctor's runtime lines: does podman, CRI-O and containerd each run devgate? The runtimes/
//! readers and judges decide; this turns their answers into lines with fixes, and collects
//! each runtime's cgroup driver for the cgroup checks.

use super::cgroup::DriverVote;
use super::containerd_checks;
use super::error::ConfigError;
use super::line::Line;
use super::options::{FixCmd, Options};
use super::runtimes::binary::{self, Identity};
use super::runtimes::{self, crio, hooks, podman};
use crate::cli::hooks_config::{HOST_HOOKS_DIR, PACKAGE_HOOKS_DIR};
use std::path::{Path, PathBuf};

/// podman's line: a hook in the directories its containers.conf names (or `--hooks-dir`)
/// runs devgate. A devgate hook in a directory podman does not read is named in the failure:
/// older installs wrote /etc/containers/oci/hooks.d, which podman reads only where
/// hooks_dir lists it.
fn podman_line(opts: &Options, fix: &FixCmd, is_devgate: &dyn Fn(&Path) -> bool) -> Line {
    let confs = podman::read_containers_confs();
    let dirs = if opts.hooks_dirs.is_empty() {
        match podman::podman_hook_dirs(&confs) {
            Ok(d) => d,
            Err(e) => {
                return Line::fail(
                    "podman",
                    e.to_string(),
                    "correct containers.conf (podman fails on it too)",
                )
            }
        }
    } else {
        opts.hooks_dirs.clone()
    };
    let files = hooks::read_hook_dirs(&dirs);
    match hooks::judge_hook_files(&files, &dirs, is_devgate) {
        Ok(t) => podman_runtime_line(&confs, t, fix),
        Err(e) => Line::fail(
            "podman",
            format!("{e}{}", unread_devgate_hooks(&dirs, "podman", is_devgate)),
            fix.hooks_config(
                "podman",
                dirs.last()
                    .map(PathBuf::as_path)
                    .unwrap_or(Path::new(PACKAGE_HOOKS_DIR)),
            ),
        ),
    }
}

/// podman's line once its hooks run devgate: crun discards a hook's output, so where
/// podman runs crun without devgate's wrapper a reject reaches podman's error only as
/// ``error executing hook `…` (exit code: 1)``.
fn podman_runtime_line(confs: &[(PathBuf, String)], hooks: String, fix: &FixCmd) -> Line {
    match podman::podman_runtime(confs) {
        Ok(podman::PodmanRuntime::Crun(name)) => Line::fail(
            "podman",
            format!(
                "{hooks}, but its runtime {name:?} is crun with devgate's hooks alone: crun \
                 discards a hook's output, so a reject reaches podman without devgate's line"
            ),
            format!(
                "{} --runtime podman --wrapper --bin {} --out /etc/containers/containers.conf.d \
                 (keep the hooks)",
                fix.prefix,
                fix.bin.display()
            ),
        ),
        Ok(podman::PodmanRuntime::Wrapper(w)) => Line::pass(
            "podman",
            format!("{hooks}; its runtime is devgate's wrapper {}", w.display()),
        ),
        Ok(podman::PodmanRuntime::Other(_)) => Line::pass("podman", hooks),
        Err(e) => Line::fail(
            "podman",
            e.to_string(),
            "correct containers.conf (podman fails on it too)",
        ),
    }
}

/// Where a well-known hooks directory that `dirs` leaves out holds devgate's hook (older
/// installs wrote /etc/containers/oci/hooks.d), a clause saying `runtime` does not read it.
fn unread_devgate_hooks(
    dirs: &[PathBuf],
    runtime: &str,
    is_devgate: &dyn Fn(&Path) -> bool,
) -> String {
    [PACKAGE_HOOKS_DIR, HOST_HOOKS_DIR]
        .iter()
        .map(PathBuf::from)
        .filter(|d| !dirs.contains(d))
        .filter(|d| {
            let d = std::slice::from_ref(d);
            hooks::judge_hook_files(&hooks::read_hook_dirs(d), d, is_devgate).is_ok()
        })
        .map(|d| {
            format!(
                "; {} has devgate's hook, but {runtime}'s hooks_dir leaves it out",
                d.display()
            )
        })
        .collect()
}

/// CRI-O's line: a hook in its hooks directories, or its default runtime being devgate's
/// wrapper, runs devgate. With hooks alone, a default runtime of crun (CRI-O's default
/// since 1.31, and what its packages set) fails: crun discards a hook's output, so a reject
/// shows as CreateContainerError without devgate's line.
fn crio_line(
    crio: &crio::CrioConfig,
    dirs: &[PathBuf],
    id: &Identity,
    fix: &FixCmd,
    nvidia_config: &Path,
) -> Line {
    let is_devgate = |p: &Path| id.is_devgate(p);
    let files = hooks::read_hook_dirs(dirs);
    let hooks = hooks::judge_hook_files(&files, dirs, &is_devgate);
    let (name, path) = crio::default_runtime_binary(crio);
    let binary = binary::classify_binary(&path, id, nvidia_config);
    let wrapper = binary
        .runs_devgate()
        .then(|| format!("default runtime {name}: {path}"));
    match (hooks, wrapper) {
        (Ok(_), Some(w)) => Line::pass("cri-o", format!("{w} is devgate's runtime wrapper")),
        // The wrapper gates and remaps; only the poststop hook reports faults.
        (Err(_), Some(w)) => Line::pass(
            "cri-o",
            format!(
                "{w} is devgate's runtime wrapper; no oci-hooks file runs devgate at poststop, \
                 so faults during a run go unreported"
            ),
        ),
        (Ok(t), None) if binary.runs_crun() => Line::fail(
            "cri-o",
            format!(
                "{t}, but its default runtime {name:?} {} with devgate's hooks alone: crun \
                 discards a hook's output, so a reject shows as CreateContainerError without \
                 devgate's line",
                binary.describe()
            ),
            format!(
                "{} --runtime crio --wrapper --bin {} --out /etc/crio/crio.conf.d, set \
                 runtime.path to crun in devgate's config, restart CRI-O (keep the hooks)",
                fix.prefix,
                fix.bin.display()
            ),
        ),
        (Ok(t), None) => Line::pass("cri-o", t),
        (Err(e), None) => Line::fail(
            "cri-o",
            format!("{e}{}", unread_devgate_hooks(dirs, "CRI-O", &is_devgate)),
            format!(
                "{} (a directory in CRI-O's hooks_dir), then restart CRI-O",
                fix.hooks_config(
                    "crio",
                    dirs.first()
                        .map(PathBuf::as_path)
                        .unwrap_or(Path::new(crio::CRIO_DEFAULT_HOOKS_DIR))
                )
            ),
        ),
    }
}

/// podman, CRI-O and containerd, in the order printed; CRI-O's and containerd's cgroup drivers
/// go to `votes`.
pub(crate) fn runtime_checks(
    opts: &Options,
    id: &Identity,
    fix: &FixCmd,
    votes: &mut Vec<DriverVote>,
) -> Vec<Line> {
    let is_devgate = |p: &Path| id.is_devgate(p);
    let nvidia_config = opts
        .nvidia_runtime_config
        .clone()
        .unwrap_or_else(|| binary::NVIDIA_RUNTIME_CONFIG.into());
    let podman = if runtimes::which("podman").is_some() {
        podman_line(opts, fix, &is_devgate)
    } else {
        Line::note("podman", "not installed")
    };
    let mut lines = vec![podman];
    lines.push(crio_check(opts, id, fix, &nvidia_config, votes));
    lines.extend(containerd_checks::containerd_lines(
        opts,
        id,
        fix,
        &nvidia_config,
        votes,
    ));
    lines
}

/// CRI-O's line, where it is installed or `--crio-config` names its config; its cgroup
/// driver goes to `votes`.
fn crio_check(
    opts: &Options,
    id: &Identity,
    fix: &FixCmd,
    nvidia_config: &Path,
    votes: &mut Vec<DriverVote>,
) -> Line {
    if runtimes::which("crio").is_none() && opts.crio_config.is_none() {
        return Line::note("cri-o", "not installed");
    }
    let crio = match crio_config(opts) {
        Ok(c) => c,
        Err(e) => {
            return Line::fail(
                "cri-o",
                e.to_string(),
                "correct CRI-O's configuration (crio config prints what it reads)",
            )
        }
    };
    let dirs = if !opts.hooks_dirs.is_empty() {
        opts.hooks_dirs.clone()
    } else {
        crio.hooks_dir
            .clone()
            .unwrap_or_else(|| vec![crio::CRIO_DEFAULT_HOOKS_DIR.into()])
    };
    let line = crio_line(&crio, &dirs, id, fix, nvidia_config);
    votes.push(match crio.cgroup_manager.as_deref() {
        Some(m) => DriverVote {
            source: format!("CRI-O cgroup_manager = {m:?}"),
            driver: m.to_string(),
        },
        None => DriverVote {
            source: "CRI-O cgroup_manager unset (its default is systemd)".into(),
            driver: "systemd".into(),
        },
    });
    line
}

/// CRI-O's configuration, from `--crio-config` or /etc/crio/crio.conf and its conf.d.
fn crio_config(opts: &Options) -> Result<crio::CrioConfig, ConfigError> {
    let main = opts
        .crio_config
        .clone()
        .unwrap_or_else(|| "/etc/crio/crio.conf".into());
    // CRI-O runs on its defaults without a file, but one named with --crio-config that
    // is not there is a mistyped path, and its defaults would be judged instead.
    let named_but_absent = opts.crio_config.is_some()
        && std::fs::symlink_metadata(&main).is_err()
        && std::fs::symlink_metadata(main.with_extension("conf.d")).is_err();
    if named_but_absent {
        Err(ConfigError::CrioConfigAbsent {
            dropins: main.with_extension("conf.d"),
            main,
        })
    } else {
        crio::read_crio(&main).and_then(|f| crio::parse_crio(&f))
    }
}
