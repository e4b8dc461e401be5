//! doctor's containerd lines: its default runtime (and each other runc runtime) wired to
//! devgate, the annotation kubelet's terminationMessagePolicy reaches poststop by, and the
//! default runtime's cgroup driver. The readers and judges are in runtimes/containerd.rs.

use super::cgroup::DriverVote;
use super::error::RuntimeNotWired;
use super::line::Line;
use super::options::{FixCmd, Options};
use super::runtimes;
use super::runtimes::binary::{self, Identity};
use super::runtimes::containerd::{self, BaseSpec, ContainerdCri, CriRuntime};
use std::path::Path;

/// containerd's lines, where its binary is found (or named with `--containerd`).
pub(crate) fn containerd_lines(
    opts: &Options,
    id: &Identity,
    fix: &FixCmd,
    nvidia_config: &Path,
    votes: &mut Vec<DriverVote>,
) -> Vec<Line> {
    let containerd_bin = opts
        .containerd
        .clone()
        .or_else(|| runtimes::which("containerd"));
    match (containerd_bin, &opts.containerd_config) {
        (None, None) => vec![Line::note("containerd", "not installed")],
        (None, Some(_)) => vec![Line::fail(
            "containerd",
            "containerd is not in PATH, so its configuration cannot be dumped",
            "name the binary with --containerd BIN",
        )],
        (Some(cbin), config) => {
            containerd_checks(&cbin, config.as_deref(), id, fix, nvidia_config, votes)
        }
    }
}

/// containerd's lines: its default runtime, then every other runc runtime that is not gated
/// (as notes), and the default runtime's SystemdCgroup as its cgroup-driver vote. Each way
/// the dump can fall short (no dump, CRI disabled, no default runtime) ends it early with
/// its own line.
fn containerd_checks(
    cbin: &Path,
    config: Option<&Path>,
    id: &Identity,
    fix: &FixCmd,
    nvidia_config: &Path,
    votes: &mut Vec<DriverVote>,
) -> Vec<Line> {
    let cri = match containerd::containerd_dump(cbin, config)
        .and_then(|t| containerd::parse_containerd_dump(&t))
    {
        Ok(c) => c,
        Err(e) => {
            return vec![Line::fail(
                "containerd",
                e.to_string(),
                "correct containerd's configuration (`containerd config dump` must succeed)",
            )]
        }
    };
    if cri.disabled {
        return vec![Line::note(
            "containerd",
            "its CRI plugin is disabled: kubelet does not use this containerd",
        )];
    }
    let default = cri.default_runtime.clone();
    let Some(rt) = cri.runtimes.get(&default) else {
        return vec![Line::fail(
            "containerd",
            format!("its default runtime {default:?} is not configured"),
            format!(
                "set default_runtime_name under [plugins.\"{}\".containerd] to a configured \
                 runtime",
                cri.plugin
            ),
        )];
    };
    let mut lines = vec![match judge_runtime(&default, rt, id, nvidia_config) {
        Ok(t) => Line::pass("containerd", format!("default {t}")),
        Err(e) => Line::fail(
            "containerd",
            e.to_string(),
            containerd::containerd_fix(&cri, &default, fix),
        ),
    }];
    lines.extend(ungated_runtimes(&cri, &default, id, nvidia_config));
    lines.extend(annotation_lines(&cri, id));
    votes.push(systemd_cgroup_vote(&default, rt));
    lines
}

/// A note for each runc runtime besides the default that does not run devgate: the pods
/// whose RuntimeClass names it are not gated.
fn ungated_runtimes(
    cri: &ContainerdCri,
    default: &str,
    id: &Identity,
    nvidia_config: &Path,
) -> Vec<Line> {
    let mut lines = Vec::new();
    for (name, other) in &cri.runtimes {
        if *name == default || other.runtime_type != "io.containerd.runc.v2" {
            continue;
        }
        if let Err(e) = judge_runtime(name, other, id, nvidia_config) {
            lines.push(Line::note(
                "containerd",
                format!("{e}: pods whose RuntimeClass names {name} are not gated"),
            ));
        }
    }
    lines
}

/// A line for each runtime whose base spec runs devgate at poststop: does its CRI pass
/// kubelet's terminationMessagePolicy annotation? Without it devgate takes every pod for
/// `File` and writes its line into the termination file, which kubelet then shows instead
/// of a FallbackToLogsOnError pod's log lines.
fn annotation_lines(cri: &ContainerdCri, id: &Identity) -> Vec<Line> {
    let check = "containerd annotations";
    let annotation = containerd::POLICY_ANNOTATION;
    cri.runtimes
        .iter()
        .filter(|(_, rt)| matches!(base_spec(rt, id), BaseSpec::Complete { stop: true, .. }))
        .map(|(name, rt)| {
            if containerd::passes_policy(rt) {
                return Line::pass(
                    check,
                    format!("runtime {name} passes {annotation} to devgate's poststop"),
                );
            }
            let has = match rt.container_annotations.as_slice() {
                [] => "has no container_annotations".to_string(),
                list => format!("has container_annotations {list:?}, none matching it"),
            };
            Line::fail(
                check,
                format!(
                    "runtime {name} runs devgate's poststop but {has}: devgate takes every pod \
                     for terminationMessagePolicy File, so a FallbackToLogsOnError pod's \
                     message loses its log lines"
                ),
                format!(
                    "add \"{annotation}\" to container_annotations under \
                     [plugins.\"{}\".containerd.runtimes.{name}] and restart containerd",
                    cri.plugin
                ),
            )
        })
        .collect()
}

/// A runtime's base spec, read and examined.
fn base_spec(rt: &CriRuntime, id: &Identity) -> BaseSpec {
    let is_devgate = |p: &Path| id.is_devgate(p);
    if rt.base_runtime_spec.is_empty() {
        BaseSpec::NotSet
    } else {
        match runtimes::read_small(Path::new(&rt.base_runtime_spec)) {
            Ok(t) => containerd::examine_base_spec(&t, &is_devgate),
            Err(e) => BaseSpec::Unreadable(e),
        }
    }
}

/// One containerd runtime judged: its base spec read and examined, its binary classified.
fn judge_runtime(
    name: &str,
    rt: &CriRuntime,
    id: &Identity,
    nvidia_config: &Path,
) -> Result<String, RuntimeNotWired> {
    let spec = base_spec(rt, id);
    let binary = binary::classify_binary(&rt.binary_name, id, nvidia_config);
    containerd::judge_containerd_runtime(name, rt, &spec, &binary)
}

/// containerd's cgroup driver: its default runtime's SystemdCgroup.
fn systemd_cgroup_vote(default: &str, rt: &CriRuntime) -> DriverVote {
    let driver = if rt.systemd_cgroup == Some(true) {
        "systemd"
    } else {
        "cgroupfs"
    };
    DriverVote {
        source: format!(
            "containerd runtime {default} SystemdCgroup = {}",
            rt.systemd_cgroup == Some(true)
        ),
        driver: driver.into(),
    }
}
