//! `devgate doctor`: for the operator who has just installed devgate. One line per check,
//! `✓` passed, `✗` failed (followed by the fix), `-` a note that fails nothing (not
//! applicable, or something only a person can check); exit 1 when any check failed.
//!
//! The checks: the config parses; devgate's directories are safe along their whole path;
//! each runtime on the node runs devgate (oci-hooks files for CRI-O and podman, containerd's
//! merged `config dump` for its base runtime spec or runtime wrapper); the cgroup mode and
//! driver; NVML and the GPUs it sees, with persistence mode; each spare and its
//! /dev/char link; spares hidden from the device plugin; the kernel log.
//!
//! Every outside string (paths, GPU names, parse errors) is printed escaped: a control
//! character becomes `\xNN`, so nothing read from the node can rewrite the terminal.

pub(crate) mod cgroup;
pub mod node;
pub(crate) mod nvml;
pub(crate) mod runtimes;

use crate::cli::hooks_config::{HOST_HOOKS_DIR, PACKAGE_HOOKS_DIR};
use crate::config::{self, Config};
use crate::model::text::one_line;
use cgroup::{DriverVerdict, DriverVote};
use nvml::NvmlAnswer;
use runtimes::binary::{self, Identity};
use runtimes::containerd::{self, BaseSpec};
use runtimes::{crio, hooks};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const USAGE: &str = "\
usage: devgate [--config PATH] doctor [--bin PATH] [--hooks-dir DIR]... [--crio-config FILE]
                                       [--containerd BIN] [--containerd-config FILE]
                                       [--nvidia-runtime-config FILE] [--kubelet-config FILE]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Pass,
    Fail,
    Note,
}

impl Mark {
    fn symbol(self) -> &'static str {
        match self {
            Mark::Pass => "✓",
            Mark::Fail => "✗",
            Mark::Note => "-",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub mark: Mark,
    pub check: String,
    pub text: String,
    pub fix: Option<String>,
}

impl Line {
    fn pass(check: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            mark: Mark::Pass,
            check: check.into(),
            text: text.into(),
            fix: None,
        }
    }

    fn fail(check: impl Into<String>, text: impl Into<String>, fix: impl Into<String>) -> Line {
        Line {
            mark: Mark::Fail,
            check: check.into(),
            text: text.into(),
            fix: Some(fix.into()),
        }
    }

    fn note(check: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            mark: Mark::Note,
            check: check.into(),
            text: text.into(),
            fix: None,
        }
    }

    /// The printed form: the mark line, and for a failure its fix on the next line.
    pub fn render(&self) -> String {
        let mut s = one_line(&format!(
            "{} {}: {}",
            self.mark.symbol(),
            self.check,
            self.text
        ));
        if let Some(f) = &self.fix {
            s.push_str("\n  fix: ");
            s.push_str(&one_line(f));
        }
        s
    }
}

/// Where doctor looks, for tests and unusual installs; each default is the node's own.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub config: Option<PathBuf>,
    /// The devgate the runtimes should run (default: this binary or an installed devgate).
    pub bin: Option<PathBuf>,
    /// Replace the oci-hooks directories CRI-O and podman would read.
    pub hooks_dirs: Vec<PathBuf>,
    pub crio_config: Option<PathBuf>,
    pub containerd: Option<PathBuf>,
    pub containerd_config: Option<PathBuf>,
    pub nvidia_runtime_config: Option<PathBuf>,
    pub kubelet_config: Option<PathBuf>,
}

fn parse(argv: &[String]) -> Result<Options, String> {
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
    )
    .map_err(|e| e.to_string())?;
    if let Some(extra) = p.positional.get(1) {
        return Err(format!("unexpected argument {extra:?}"));
    }
    let path = |name: &str| -> Result<Option<PathBuf>, String> {
        match p.value(name) {
            Some("") => Err(format!("{name} needs a value")),
            v => Ok(v.map(PathBuf::from)),
        }
    };
    let mut hooks_dirs = Vec::new();
    for d in p.values("--hooks-dir") {
        if d.is_empty() {
            return Err("--hooks-dir needs a value".into());
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
pub fn cli(argv: &[String]) -> Option<i32> {
    let command = crate::cli::args::command(argv)?;
    if command != "doctor" {
        return None;
    }
    let opts = match parse(argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("devgate: error: {}\n{USAGE}", one_line(&e));
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
        "devgate doctor: {failed} failed, {passed} passed, {notes} notes"
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

/// Every check, in order; `emit` sees each line as soon as it is decided.
pub fn run(opts: &Options, emit: &mut dyn FnMut(&Line)) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut push = |l: Line| {
        emit(&l);
        lines.push(l);
    };

    let config = match Config::load(opts.config.as_deref()) {
        Ok(c) => {
            push(Line::pass(
                "config",
                match &c.source {
                    Some(p) => format!("{} parses", p.display()),
                    None => format!("{} absent: built-in defaults", config::DEFAULT_PATH),
                },
            ));
            c
        }
        Err(e) => {
            push(Line::fail(
                "config",
                e.to_string(),
                "correct the file (devgate refuses unknown keys and relative paths); every \
                 hook fails until it parses",
            ));
            push(Line::note("other checks", "skipped: they read the config"));
            return lines;
        }
    };
    let config_path = config
        .source
        .clone()
        .unwrap_or_else(|| config::DEFAULT_PATH.into());

    for l in directory_checks(&config) {
        push(l);
    }

    let id = Identity::new(opts.bin.as_deref());
    let bin = opts.bin.clone().unwrap_or_else(|| id.this.clone());
    // The fixes generate hooks for the config doctor checked, named only when it is not
    // the default (a hook without --config reads the default).
    let named = config
        .source
        .as_deref()
        .filter(|p| *p != Path::new(config::DEFAULT_PATH));
    let fix = FixCmd {
        prefix: match named {
            Some(p) => format!("devgate --config {} hooks-config", p.display()),
            None => "devgate hooks-config".into(),
        },
        bin,
    };
    let mut votes = Vec::new();
    for l in runtime_checks(opts, &id, &fix, &mut votes) {
        push(l);
    }
    for l in cgroup_checks(opts, &config, votes) {
        push(l);
    }

    let timeout = Duration::from_millis(config.probe_timeout_ms);
    let nvml = nvml::nvml_inventory(&config.nvml_library, timeout);
    for l in nvml_checks(&config, &nvml) {
        push(l);
    }
    for l in spare_checks(&config, &config_path, &nvml) {
        push(l);
    }

    push(match node::read_one_kmsg_record(&config.kmsg_path) {
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
    });
    lines
}

fn directory_checks(config: &Config) -> Vec<Line> {
    let mut dirs = vec![
        ("state_dir", config.state_dir.clone()),
        ("quarantine_dir", config.quarantine_dir.clone()),
    ];
    if let Some(dir) = config.log_file.as_deref().and_then(Path::parent) {
        dirs.push(("log_file directory", dir.to_path_buf()));
    }
    dirs.into_iter()
        .map(|(name, dir)| match node::check_safe_dir(&dir) {
            Ok(note) => Line::pass(name, format!("{}: {note}", dir.display())),
            Err(e) => Line::fail(
                name,
                format!("{}: {e}", dir.display()),
                "make every directory on the path root's and not writable by group or \
                 others (chown root, chmod go-w), or point the config at one that is",
            ),
        })
        .collect()
}

/// podman's hook directories: containers.conf's [engine] hooks_dir, else both defaults.
fn podman_hook_dirs() -> Vec<PathBuf> {
    #[derive(serde::Deserialize, Default)]
    struct ContainersConf {
        #[serde(default)]
        engine: Engine,
    }
    #[derive(serde::Deserialize, Default)]
    struct Engine {
        hooks_dir: Option<Vec<PathBuf>>,
    }
    let mut dirs = None;
    for f in [
        "/usr/share/containers/containers.conf",
        "/etc/containers/containers.conf",
    ] {
        let set = runtimes::read_small(Path::new(f))
            .ok()
            .and_then(|t| toml::from_str::<ContainersConf>(&t).ok())
            .and_then(|c| c.engine.hooks_dir);
        if set.is_some() {
            dirs = set;
        }
    }
    dirs.unwrap_or_else(|| vec![PACKAGE_HOOKS_DIR.into(), HOST_HOOKS_DIR.into()])
}

/// How the fix lines spell `devgate hooks-config` for this node.
pub struct FixCmd {
    /// `devgate [--config PATH] hooks-config`.
    pub prefix: String,
    /// The devgate the hooks should run.
    pub bin: PathBuf,
}

impl FixCmd {
    fn hooks_config(&self, runtime: &str, out: &Path) -> String {
        format!(
            "{} --runtime {runtime} --bin {} --out {}",
            self.prefix,
            self.bin.display(),
            out.display()
        )
    }
}

fn runtime_checks(
    opts: &Options,
    id: &Identity,
    fix: &FixCmd,
    votes: &mut Vec<DriverVote>,
) -> Vec<Line> {
    let mut lines = Vec::new();
    let is_devgate = |p: &Path| id.is_devgate(p);
    let nvidia_config = opts
        .nvidia_runtime_config
        .clone()
        .unwrap_or_else(|| binary::NVIDIA_RUNTIME_CONFIG.into());

    // podman
    if runtimes::which("podman").is_some() {
        let dirs = if opts.hooks_dirs.is_empty() {
            podman_hook_dirs()
        } else {
            opts.hooks_dirs.clone()
        };
        let files = hooks::read_hook_dirs(&dirs);
        lines.push(match hooks::judge_hook_files(&files, &dirs, &is_devgate) {
            Ok(t) => Line::pass("podman", t),
            Err(e) => Line::fail(
                "podman",
                e,
                fix.hooks_config(
                    "podman",
                    dirs.last()
                        .map(PathBuf::as_path)
                        .unwrap_or(Path::new(HOST_HOOKS_DIR)),
                ),
            ),
        });
    } else {
        lines.push(Line::note("podman", "not installed"));
    }

    // CRI-O
    if runtimes::which("crio").is_some() || opts.crio_config.is_some() {
        let main = opts
            .crio_config
            .clone()
            .unwrap_or_else(|| "/etc/crio/crio.conf".into());
        match crio::read_crio(&main).and_then(|f| crio::parse_crio(&f)) {
            Err(e) => lines.push(Line::fail(
                "cri-o",
                e,
                "correct CRI-O's configuration (crio config prints what it reads)",
            )),
            Ok(crio) => {
                let dirs = if !opts.hooks_dirs.is_empty() {
                    opts.hooks_dirs.clone()
                } else {
                    crio.hooks_dir
                        .clone()
                        .unwrap_or_else(|| vec![crio::CRIO_DEFAULT_HOOKS_DIR.into()])
                };
                let files = hooks::read_hook_dirs(&dirs);
                let hooks = hooks::judge_hook_files(&files, &dirs, &is_devgate);
                let wrapper = crio.default_runtime.as_ref().and_then(|name| {
                    let path = crio.runtime_paths.get(name)?;
                    let b = binary::classify_binary(path, id, &nvidia_config);
                    b.runs_devgate()
                        .then(|| format!("default runtime {name}: {path}"))
                });
                lines.push(match (hooks, wrapper) {
                    (Ok(_), Some(w)) => {
                        Line::pass("cri-o", format!("{w} is devgate's runtime wrapper"))
                    }
                    // The wrapper gates and remaps; only the poststop hook reports faults.
                    (Err(_), Some(w)) => Line::pass(
                        "cri-o",
                        format!(
                            "{w} is devgate's runtime wrapper; no oci-hooks file runs devgate \
                             at poststop, so faults during a run go unreported"
                        ),
                    ),
                    (Ok(t), None) => Line::pass("cri-o", t),
                    (Err(e), None) => Line::fail(
                        "cri-o",
                        e,
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
                });
                let vote = match crio.cgroup_manager.as_deref() {
                    Some(m) => DriverVote {
                        source: format!("CRI-O cgroup_manager = {m:?}"),
                        driver: m.to_string(),
                    },
                    None => DriverVote {
                        source: "CRI-O cgroup_manager unset (its default is systemd)".into(),
                        driver: "systemd".into(),
                    },
                };
                votes.push(vote);
            }
        }
    } else {
        lines.push(Line::note("cri-o", "not installed"));
    }

    // containerd
    let containerd_bin = opts
        .containerd
        .clone()
        .or_else(|| runtimes::which("containerd"));
    match (containerd_bin, &opts.containerd_config) {
        (None, None) => lines.push(Line::note("containerd", "not installed")),
        (None, Some(_)) => lines.push(Line::fail(
            "containerd",
            "containerd is not in PATH, so its configuration cannot be dumped",
            "name the binary with --containerd BIN",
        )),
        (Some(cbin), config) => {
            lines.extend(containerd_checks(
                &cbin,
                config.as_deref(),
                id,
                fix,
                &nvidia_config,
                votes,
            ));
        }
    }
    lines
}

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
                e,
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
    let is_devgate = |p: &Path| id.is_devgate(p);
    let judge = |name: &str, rt: &containerd::CriRuntime| {
        let spec = if rt.base_runtime_spec.is_empty() {
            BaseSpec::NotSet
        } else {
            match runtimes::read_small(Path::new(&rt.base_runtime_spec)) {
                Ok(t) => containerd::examine_base_spec(&t, &is_devgate),
                Err(e) => BaseSpec::Unreadable(e),
            }
        };
        let binary = binary::classify_binary(&rt.binary_name, id, nvidia_config);
        containerd::judge_containerd_runtime(name, rt, &spec, &binary)
    };
    let mut lines = Vec::new();
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
    lines.push(match judge(&default, rt) {
        Ok(t) => Line::pass("containerd", format!("default {t}")),
        Err(e) => Line::fail(
            "containerd",
            e,
            containerd::containerd_fix(&cri, &default, fix),
        ),
    });
    for (name, other) in &cri.runtimes {
        if *name == default || other.runtime_type != "io.containerd.runc.v2" {
            continue;
        }
        if let Err(e) = judge(name, other) {
            lines.push(Line::note(
                "containerd",
                format!("{e}: pods whose RuntimeClass names {name} are not gated"),
            ));
        }
    }
    let driver = if rt.systemd_cgroup == Some(true) {
        "systemd"
    } else {
        "cgroupfs"
    };
    votes.push(DriverVote {
        source: format!(
            "containerd runtime {default} SystemdCgroup = {}",
            rt.systemd_cgroup == Some(true)
        ),
        driver: driver.into(),
    });
    lines
}

fn cgroup_checks(opts: &Options, config: &Config, votes: Vec<DriverVote>) -> Vec<Line> {
    let mut lines = vec![match cgroup::read_cgroup_mode(&config.sysfs_root) {
        Ok((mode, top)) => Line::pass("cgroup mode", cgroup::describe_cgroup_mode(mode, &top)),
        Err(e) => Line::fail(
            "cgroup mode",
            e,
            "mount the cgroup hierarchy at /sys/fs/cgroup (or set sysfs_root in the config)",
        ),
    }];
    let kubelet = opts.kubelet_config.clone().or_else(|| {
        let p = config.kubelet_pods_dir.parent()?.join("config.yaml");
        p.exists().then_some(p)
    });
    let mut kubelet_vote = None;
    if let Some(k) = kubelet {
        match runtimes::read_small(&k) {
            Ok(t) => {
                kubelet_vote = Some(match cgroup::kubelet_cgroup_driver(&t) {
                    Some(d) => DriverVote {
                        source: format!("kubelet {} cgroupDriver: {d}", k.display()),
                        driver: d,
                    },
                    None => DriverVote {
                        source: format!(
                            "kubelet {} sets no cgroupDriver (its default is cgroupfs)",
                            k.display()
                        ),
                        driver: "cgroupfs".into(),
                    },
                })
            }
            Err(e) => lines.push(Line::note("cgroup driver", e)),
        }
    }
    lines.push(match cgroup::decide_driver(kubelet_vote.as_ref(), &votes) {
        DriverVerdict::Unknown => Line::note(
            "cgroup driver",
            "unknown: no containerd, CRI-O or kubelet configuration says",
        ),
        DriverVerdict::Agreed(driver, how) => {
            Line::pass("cgroup driver", format!("{driver}, as {how}"))
        }
        DriverVerdict::Mixed(how) => Line::note(
            "cgroup driver",
            format!("the configurations differ ({how}); the runtime kubelet uses must match it"),
        ),
        DriverVerdict::Conflict(how) => Line::fail(
            "cgroup driver",
            format!("kubelet and the runtimes disagree ({how})"),
            "give kubelet's cgroupDriver and the runtime's setting (containerd SystemdCgroup, \
             CRI-O cgroup_manager) the same driver",
        ),
    });
    lines
}

fn nvml_checks(config: &Config, nvml: &NvmlAnswer) -> Vec<Line> {
    let lib = config.nvml_library.display();
    match nvml {
        NvmlAnswer::Failed { error, no_driver } => {
            if *no_driver && !nvml::has_nvidia_nodes(&config.dev_root) {
                vec![Line::note(
                    "nvml",
                    format!("no NVIDIA driver (CPU node): {error}"),
                )]
            } else {
                vec![Line::fail(
                    "nvml",
                    error.clone(),
                    "install the NVIDIA driver's NVML library (libnvidia-ml.so.1) or set \
                     nvml_library in the config to its path; an NVML that does not answer \
                     means a failing GPU or driver (look for XIDs in the kernel log)",
                )]
            }
        }
        NvmlAnswer::Gpus { driver, gpus } => {
            let mut lines = vec![Line::pass(
                "nvml",
                format!(
                    "{lib} loaded, driver {}, {} GPU(s)",
                    driver.as_deref().unwrap_or("unknown"),
                    gpus.len()
                ),
            )];
            for g in gpus {
                let check = format!("gpu {}", g.index);
                let desc = nvml::describe_gpu(g);
                lines.push(match (&g.unreachable, &g.persistence) {
                    (Some(e), _) => Line::fail(
                        check,
                        format!("NVML gives no handle: {e}"),
                        "`devgate status` and the kernel log say why; the GPU may need a \
                         reset (nvidia-smi -r) or the node a reboot",
                    ),
                    (None, Ok(true)) => Line::pass(check, format!("{desc}; persistence mode on")),
                    (None, Ok(false)) => Line::fail(
                        check,
                        format!(
                            "{desc}; persistence mode off: the driver sets the GPU up again on \
                             each container start, which can take seconds"
                        ),
                        format!(
                            "nvidia-smi -i {} -pm 1, or enable nvidia-persistenced \
                             (systemctl enable --now nvidia-persistenced)",
                            g.index
                        ),
                    ),
                    (None, Err(e)) => {
                        Line::note(check, format!("{desc}; persistence mode unknown: {e}"))
                    }
                });
            }
            lines
        }
    }
}

fn spare_checks(config: &Config, config_path: &Path, nvml: &NvmlAnswer) -> Vec<Line> {
    let mut lines = Vec::new();
    let checkpoint = config
        .kubelet_pods_dir
        .parent()
        .unwrap_or(Path::new("/"))
        .join("device-plugins/kubelet_internal_checkpoint");
    let registered = match std::fs::symlink_metadata(&checkpoint) {
        Err(_) => None,
        Ok(_) => Some(
            runtimes::read_small(&checkpoint)
                .and_then(|t| node::nvidia_registered(&t))
                .map_err(|e| format!("{}: {e}", checkpoint.display())),
        ),
    };
    // The GPUs the device plugin may advertise: every GPU NVML sees but the spares.
    let spare_minors: Vec<u32> = config
        .spares
        .get(crate::model::class::Class::NvidiaGpu.as_str())
        .into_iter()
        .flatten()
        .filter_map(|p| node::spare_device(p).ok())
        .map(|n| n.minor)
        .collect();
    let keep: Vec<String> = match nvml {
        NvmlAnswer::Gpus { gpus, .. } => gpus
            .iter()
            .filter(|g| g.minor.is_some_and(|m| !spare_minors.contains(&m)))
            .filter_map(|g| g.uuid.clone())
            .collect(),
        NvmlAnswer::Failed { .. } => Vec::new(),
    };
    for (class, paths) in &config.spares {
        for path in paths {
            let what = format!("{} ({class})", path.display());
            let num = match node::spare_device(path) {
                Ok(n) => n,
                Err(e) => {
                    lines.push(Line::fail(
                        "spare",
                        format!("{what}: {e}"),
                        format!(
                            "remove it from spares in {} or bring the device back",
                            config_path.display()
                        ),
                    ));
                    continue;
                }
            };
            let link = node::dev_link(&config.dev_root, num);
            let what = format!("{} ({class}, {} {num})", path.display(), num.typ.letter());
            lines.push(match node::check_dev_link(&link, num) {
                Ok(()) => Line::pass("spare", format!("{what}; {} links to it", link.display())),
                Err(e) => Line::fail(
                    "spare",
                    format!(
                        "{what}: {e}; under the systemd cgroup driver runc skips a DeviceAllow \
                         whose path is missing, so the spare is denied after a daemon-reload"
                    ),
                    node::dev_link_fix(path, &link, &config.dev_root, class),
                ),
            });
            lines.push(hidden_check(
                class,
                path,
                num,
                nvml,
                (&checkpoint, &registered),
                &keep,
            ));
        }
    }
    lines
}

/// What kubelet's checkpoint says the NVIDIA device plugin registered: None when there is no
/// checkpoint.
type Registered = Option<Result<std::collections::BTreeMap<String, Vec<String>>, String>>;

/// Is the spare hidden from the device plugin? kubelet would otherwise hand the "spare"
/// to another pod.
fn hidden_check(
    class: &str,
    path: &Path,
    num: crate::model::device::DevNum,
    nvml: &NvmlAnswer,
    (checkpoint, registered): (&Path, &Registered),
    keep: &[String],
) -> Line {
    let check = "spare hidden";
    if class != crate::model::class::Class::NvidiaGpu.as_str() {
        return Line::note(
            check,
            format!(
                "{} ({class}): check by hand that no device plugin or DRA driver advertises it",
                path.display()
            ),
        );
    }
    let gpu = match nvml {
        NvmlAnswer::Gpus { gpus, .. } => gpus
            .iter()
            .find(|g| g.minor == Some(num.minor))
            .and_then(|g| Some((g.uuid.clone()?, g.index))),
        NvmlAnswer::Failed { .. } => None,
    };
    let Some((uuid, index)) = gpu else {
        return Line::note(
            check,
            format!(
                "{}: cannot tell, NVML does not name this GPU; check by hand that the NVIDIA \
                 device plugin's NVIDIA_VISIBLE_DEVICES leaves it out",
                path.display()
            ),
        );
    };
    let by_hand = format!(
        "check by hand that the NVIDIA device plugin's container sets NVIDIA_VISIBLE_DEVICES \
         without {uuid} and runs unprivileged, or that `kubectl get resourceslices -o yaml` \
         (a DRA driver) does not list it"
    );
    match registered {
        None => Line::note(
            check,
            format!(
                "{} ({uuid}): cannot tell, {} is absent; {by_hand}",
                path.display(),
                checkpoint.display()
            ),
        ),
        Some(Err(e)) => Line::note(
            check,
            format!("{} ({uuid}): cannot tell, {e}; {by_hand}", path.display()),
        ),
        Some(Ok(r)) if r.is_empty() => Line::note(
            check,
            format!(
                "{} ({uuid}): no NVIDIA device plugin is registered with kubelet; {by_hand}",
                path.display()
            ),
        ),
        Some(Ok(r)) => match node::advertised_as(r, &uuid, index) {
            Some(res) => Line::fail(
                check,
                format!(
                    "{} ({uuid}) is advertised to kubelet as {res}: kubelet can give the spare \
                     to another pod",
                    path.display()
                ),
                format!(
                    "set NVIDIA_VISIBLE_DEVICES={} on the NVIDIA device plugin's container \
                     (the GPUs that are not spares), run it unprivileged (privileged, it sees \
                     every GPU), and restart it",
                    keep.join(",")
                ),
            ),
            None => Line::pass(
                check,
                format!(
                    "{} ({uuid}) is not among the devices the NVIDIA device plugin registered ({})",
                    path.display(),
                    r.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn escape_control_characters() {
        assert_eq!(one_line("a\x1b[31mb\nc\u{9b}"), "a\\x1b[31mb\\x0ac\\x9b");
        assert_eq!(one_line("GPU ✓ é"), "GPU ✓ é");
        let l = Line::fail("x", "bad\nline", "do\x07this");
        assert_eq!(l.render(), "✗ x: bad\\x0aline\n  fix: do\\x07this");
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
