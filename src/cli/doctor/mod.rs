//! `devgate doctor`: for the operator who has just installed devgate. One line per check,
//! `✓` passed, `✗` failed (followed by the fix), `-` a note that fails nothing (not
//! applicable, or something only a person can check), `⚠` a warning that fails nothing; exit 1 when any check failed.
//!
//! The checks: the config parses; devgate's directories are safe along their whole path;
//! each runtime on the node runs devgate (oci-hooks files for CRI-O and podman, containerd's
//! merged `config dump` for its base runtime spec or runtime wrapper, and the annotation
//! kubelet's terminationMessagePolicy reaches poststop by); the cgroup mode and driver;
//! kubelet_pods_dir and kubelet_pod_logs_dir against the running kubelet's; NVML and the GPUs it sees, with persistence mode; the NVIDIA toolkit's config
//! devgate reads for `gpu.env_selectors`; each spare and its /dev/char link; spares hidden
//! from the device plugin; the kernel log; the node agent's status (`agent.rs`).
//!
//! Every outside string (paths, GPU names, parse errors) is printed escaped: a control
//! character becomes `\xNN`, so nothing read from the node can rewrite the terminal.
//!
//! Here: the command line and the order of the checks. line.rs holds the report's line and
//! its printed form; runtime_checks.rs and node_checks.rs the check groups, which call the
//! readers and pure judges in runtimes/, cgroup.rs, nvml.rs and node.rs; kubelet_checks.rs
//! the kubelet lines, over kubelet.rs's readers.

mod agent;
pub(crate) mod cgroup;
mod containerd_checks;
pub(crate) mod error;
pub(crate) mod kubelet;
mod kubelet_checks;
pub(crate) mod kubelet_config;
mod line;
pub(crate) mod node;
mod node_checks;
pub(crate) mod nvml;
mod options;
pub(crate) mod runtime_checks;
pub(crate) mod runtimes;
mod toolkit;

use crate::config::{self, Config};
use crate::error::Error;
use crate::model::text::one_line;
use line::{Line, Mark};
pub(crate) use options::{FixCmd, Options};
use runtimes::binary::Identity;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) const USAGE: &str = "\
usage: devgate [--config PATH] doctor [--bin PATH] [--hooks-dir DIR]... [--crio-config FILE]
                                       [--containerd BIN] [--containerd-config FILE]
                                       [--nvidia-runtime-config FILE] [--kubelet-config FILE]";

fn parse(argv: &[String]) -> Result<Options, Error> {
    let p = crate::cli::args::parse(
        argv,
        &[
            "--config",
            "--bin",
            "--hooks-dir",
            "--crio-config",
            "--containerd",
            "--containerd-config",
            "--nvidia-runtime-config",
            "--kubelet-config",
        ],
        &[],
    )?;
    if let Some(extra) = p.positional.get(1) {
        return Err(Error::Usage(format!("unexpected argument {extra:?}")));
    }
    let path = |name: &str| -> Result<Option<PathBuf>, Error> {
        match p.value(name) {
            Some("") => Err(Error::Usage(format!("{name} needs a value"))),
            v => Ok(v.map(PathBuf::from)),
        }
    };
    let mut hooks_dirs = Vec::new();
    for d in p.values("--hooks-dir") {
        if d.is_empty() {
            return Err(Error::Usage("--hooks-dir needs a value".into()));
        }
        hooks_dirs.push(PathBuf::from(d));
    }
    Ok(Options {
        config: path("--config")?,
        bin: path("--bin")?,
        hooks_dirs,
        crio_config: path("--crio-config")?,
        containerd: path("--containerd")?,
        containerd_config: path("--containerd-config")?,
        nvidia_runtime_config: path("--nvidia-runtime-config")?,
        kubelet_config: path("--kubelet-config")?,
    })
}

/// Runs `doctor` if `argv` names it (after the global `--config PATH`); the exit status.
pub(crate) fn cli(argv: &[String]) -> Option<i32> {
    let command = crate::cli::args::command(argv)?;
    if command != "doctor" {
        return None;
    }
    let opts = match parse(argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("devgate: error: {}\n{USAGE}", one_line(&e.to_string()));
            return Some(2);
        }
    };
    let mut out = std::io::stdout().lock();
    let lines = run(&opts, &mut |l: &Line| {
        let _ = writeln!(out, "{}", l.render());
        let _ = out.flush();
    });
    let failed = lines.iter().filter(|l| l.mark == Mark::Fail).count();
    let passed = lines.iter().filter(|l| l.mark == Mark::Pass).count();
    let notes = lines.len() - failed - passed;
    let _ = writeln!(
        out,
        "devgate doctor: {failed} failed, {passed} passed, {notes} note{}",
        if notes == 1 { "" } else { "s" }
    );
    let code = if failed > 0 { 1 } else { 0 };
    if nvml::nvml_abandoned() {
        // NVML is stuck on its thread: exit() would run the library's destructors under
        // it (see probe::nvml). Everything doctor says is already written.
        let _ = out.flush();
        // SAFETY: _exit ends the process at once; no Rust state is used after it.
        unsafe { libc::_exit(code) }
    }
    Some(code)
}

/// Every check, in order; `emit` sees each line as soon as it is decided. Between the
/// groups is made what the later ones need: the config, devgate's identity and the fix
/// commands, NVML's answer.
pub(crate) fn run(opts: &Options, emit: &mut dyn FnMut(&Line)) -> Vec<Line> {
    let mut report = Report {
        emit,
        lines: Vec::new(),
    };
    let Some(config) = config_check(opts, &mut report) else {
        return report.lines;
    };
    let config_path = config
        .source
        .clone()
        .unwrap_or_else(|| config::DEFAULT_PATH.into());
    report.extend(node_checks::directory_checks(&config));

    let id = Identity::new(opts.bin.as_deref());
    let fix = fix_command(opts, &config, &id);
    let mut votes = Vec::new();
    report.extend(runtime_checks::runtime_checks(opts, &id, &fix, &mut votes));
    let kubelet = kubelet_checks::look(opts, &config, Path::new("/proc"));
    report.extend(node_checks::cgroup_checks(
        &config,
        kubelet.file.as_ref(),
        votes,
    ));
    report.extend(kubelet_checks::kubelet_checks(
        &kubelet,
        &config,
        &config_path,
    ));

    let timeout = Duration::from_millis(config.probe_timeout_ms);
    let nvml = nvml::nvml_inventory(&config.nvml_library, timeout);
    report.extend(node_checks::nvml_checks(&config, &nvml));
    report.extend(toolkit::toolkit_checks(&config));
    report.extend(node_checks::spare_checks(&config, &config_path, &nvml));
    report.push(kernel_log_check(&config));
    report.push(agent::agent_check(&config.state_dir));
    report.extend(agent::taints_check(
        &config.state_dir,
        config.cluster_taints_max_age_s,
    ));
    report.lines
}

/// The lines decided so far; each is shown to `emit` as it is added.
struct Report<'e> {
    emit: &'e mut dyn FnMut(&Line),
    lines: Vec<Line>,
}

impl Report<'_> {
    fn push(&mut self, l: Line) {
        (self.emit)(&l);
        self.lines.push(l);
    }

    fn extend(&mut self, lines: impl IntoIterator<Item = Line>) {
        for l in lines {
            self.push(l);
        }
    }
}

/// The config's line; None (after a note that the rest is skipped) when it does not load,
/// since every other check reads it.
fn config_check(opts: &Options, report: &mut Report) -> Option<Config> {
    match Config::load(opts.config.as_deref()) {
        Ok(c) => {
            report.push(Line::pass(
                "config",
                match &c.source {
                    Some(p) => format!("{} parses", p.display()),
                    None => format!("{} absent: built-in defaults", config::DEFAULT_PATH),
                },
            ));
            Some(c)
        }
        Err(e) => {
            report.push(Line::fail(
                "config",
                e.to_string(),
                "correct the file (devgate refuses unknown keys and classes, and relative paths); every \
                 hook fails until it parses",
            ));
            report.push(Line::note("other checks", "skipped: they read the config"));
            None
        }
    }
}

/// The commands the fixes name. They generate hooks for the config doctor checked, named
/// only when it is not the default (a hook without --config reads the default).
fn fix_command(opts: &Options, config: &Config, id: &Identity) -> FixCmd {
    let bin = opts.bin.clone().unwrap_or_else(|| id.this.clone());
    let named = config
        .source
        .as_deref()
        .filter(|p| *p != Path::new(config::DEFAULT_PATH));
    FixCmd {
        prefix: match named {
            Some(p) => format!("devgate --config {} hooks-config", p.display()),
            None => "devgate hooks-config".into(),
        },
        bin,
    }
}

/// Whether devgate can read the kernel log, where XID reports are.
fn kernel_log_check(config: &Config) -> Line {
    match node::read_one_kmsg_record(&config.kmsg_path) {
        Ok(how) => Line::pass(
            "kernel log",
            format!("{} {how}", config.kmsg_path.display()),
        ),
        Err(e) => Line::fail(
            "kernel log",
            format!("{e}; XID reports cannot be read"),
            "run devgate as root (reading /dev/kmsg with kernel.dmesg_restrict=1 needs \
             CAP_SYSLOG), or set kmsg_path in the config to the kernel log",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_line() {
        assert_eq!(cli(&argv("status")), None);
        assert_eq!(cli(&argv("--config /c.json hook prestart")), None);
        let o = parse(&argv(
            "--config /c.json doctor --hooks-dir /a --hooks-dir=/b --containerd-config /x.toml",
        ))
        .unwrap();
        assert_eq!(o.config.as_deref(), Some(Path::new("/c.json")));
        assert_eq!(o.hooks_dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(o.containerd_config.as_deref(), Some(Path::new("/x.toml")));
        assert!(parse(&argv("doctor --bogus")).is_err());
        assert!(parse(&argv("doctor --hooks-dir")).is_err());
        assert!(parse(&argv("doctor extra")).is_err());
    }
}
