//! What doctor's readers and judges say went wrong: a runtime's configuration that could not
//! be read or understood ([`ConfigError`]), a node's device, link, kernel log or cgroup
//! hierarchy ([`NodeError`]), and why a runtime does not run devgate as it must
//! ([`HooksNotWired`], [`RuntimeNotWired`]). Each prints as the text of its ✗ line (or
//! note). It imports nothing of doctor's own: the readers in runtimes/, node.rs and
//! cgroup.rs, the check groups, and install-host's containerd checks all take it.

use crate::cli::host_exec::RunError;
use crate::error::{Error, IoCause};
use crate::model::device::DevNum;
use std::fmt;
use std::path::PathBuf;

/// Why a runtime's configuration (a file, or containerd's dump of its own) could not be
/// read or understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// The file could not be opened or stat'ed.
    Io(Error),
    NotRegular(PathBuf),
    Read {
        path: PathBuf,
        source: IoCause,
    },
    TooLarge {
        path: PathBuf,
        max: u64,
    },
    NotUtf8(PathBuf),
    /// Not TOML of the shape read (toml's words on one line), in `path` where one is named.
    Toml {
        path: Option<PathBuf>,
        msg: String,
    },
    /// An oci-hooks file that is not JSON of its shape.
    Json {
        path: PathBuf,
        msg: String,
    },
    /// A base runtime spec that is not an OCI spec.
    NotSpec(String),
    /// kubelet's device plugin checkpoint, not one.
    NotCheckpoint(String),
    /// kubelet's config file (KubeletConfiguration), not one devgate can read.
    Kubelet {
        path: PathBuf,
        msg: String,
    },
    /// containers.conf's `[engine] hooks_dir` is not a list of paths.
    HooksDirNotPaths(PathBuf),
    /// containers.conf's `[engine]` holds a value of the wrong kind (`what`).
    Engine {
        path: PathBuf,
        what: &'static str,
    },
    /// A drop-in directory holding more files than devgate reads: all are read or none.
    TooManyDropIns {
        dir: PathBuf,
        max: usize,
    },
    /// `--crio-config` names a file that is not there, nor its drop-in directory.
    CrioConfigAbsent {
        main: PathBuf,
        dropins: PathBuf,
    },
    /// None of NVIDIA's runtime's candidates is installed.
    NoneInstalled(Vec<String>),
    /// containerd's dump is of a config version devgate does not know.
    DumpVersion(i64),
    NoDumpVersion,
    /// The CRI plugin's table in the dump is not of its shape.
    Plugin {
        plugin: &'static str,
        msg: String,
    },
    /// `containerd config dump` (`bin`) fell short.
    DumpRun {
        bin: PathBuf,
        run: RunError,
    },
    DumpNotUtf8,
}

impl ConfigError {
    /// A TOML error with no file named, now named `path`.
    pub(crate) fn in_file(self, path: &std::path::Path) -> ConfigError {
        match self {
            ConfigError::Toml { path: None, msg } => ConfigError::Toml {
                path: Some(path.to_path_buf()),
                msg,
            },
            other => other,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError as E;
        match self {
            E::Io(e) => e.fmt(f),
            E::NotRegular(p) => write!(f, "{} is not a regular file", p.display()),
            E::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            E::TooLarge { path, max } => write!(f, "{} is larger than {max} bytes", path.display()),
            E::NotUtf8(p) => write!(f, "{} is not UTF-8 text", p.display()),
            E::Toml { path: Some(p), msg } | E::Json { path: p, msg } => {
                write!(f, "{}: {msg}", p.display())
            }
            E::Toml { path: None, msg } => f.write_str(msg),
            E::NotSpec(e) => write!(f, "not an OCI spec: {e}"),
            E::NotCheckpoint(e) => write!(f, "not a kubelet checkpoint: {e}"),
            E::Kubelet { path, msg } => write!(f, "{}: {msg}", path.display()),
            E::TooManyDropIns { dir, max } => {
                write!(f, "{}: more than {max} drop-in files", dir.display())
            }
            E::HooksDirNotPaths(p) => {
                write!(
                    f,
                    "{}: [engine] hooks_dir is not a list of paths",
                    p.display()
                )
            }
            E::Engine { path, what } => write!(f, "{}: [engine] {what}", path.display()),
            E::CrioConfigAbsent { main, dropins } => write!(
                f,
                "--crio-config {}: no such file, nor {}",
                main.display(),
                dropins.display()
            ),
            E::NoneInstalled(c) => {
                write!(f, "none of its runtimes ({}) is installed", c.join(", "))
            }
            E::DumpVersion(v) => write!(f, "config version {v} is not one devgate knows (2 or 3)"),
            E::NoDumpVersion => f.write_str("the dump names no config version"),
            E::Plugin { plugin, msg } => write!(f, "plugins.\"{plugin}\": {msg}"),
            E::DumpRun { bin, run } => match run {
                RunError::TooLarge(max) => {
                    write!(f, "containerd's dump is larger than {max} bytes")
                }
                RunError::Spawn(e) => write!(f, "cannot run {}: {e}", bin.display()),
                RunError::Root(_) => run.fmt(f),
                e => write!(f, "{} config dump {e}", bin.display()),
            },
            E::DumpNotUtf8 => f.write_str("containerd's dump is not UTF-8"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// What is wrong on the node itself: a spare's node or its /dev/char link, the kernel log,
/// the cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeError {
    Missing(PathBuf),
    Stat {
        path: PathBuf,
        source: IoCause,
    },
    NotDevice(PathBuf),
    LinkMissing(PathBuf),
    /// The link resolves to another device.
    LinkElsewhere {
        link: PathBuf,
        found: DevNum,
    },
    LinkNotDevice(PathBuf),
    /// The kernel log could not be opened.
    Open(Error),
    Read {
        path: PathBuf,
        source: IoCause,
    },
    Statfs {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Missing(p) => write!(f, "{} does not exist", p.display()),
            NodeError::Stat { path, source } => {
                write!(f, "cannot stat {}: {source}", path.display())
            }
            NodeError::NotDevice(p) => write!(f, "{} is not a device node", p.display()),
            NodeError::LinkMissing(p) => write!(f, "{} is missing", p.display()),
            NodeError::LinkElsewhere { link, found } => write!(
                f,
                "{} resolves to {} {found}, not the spare",
                link.display(),
                found.typ.letter()
            ),
            NodeError::LinkNotDevice(p) => {
                write!(f, "{} does not resolve to a device", p.display())
            }
            NodeError::Open(e) => e.fmt(f),
            NodeError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            NodeError::Statfs { path, errno } => {
                write!(f, "cannot statfs {}: {errno}", path.display())
            }
        }
    }
}

impl std::error::Error for NodeError {}

/// Why the oci-hooks files in a runtime's hooks directories do not run devgate as it must.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HooksNotWired {
    /// A file whose name says devgate does not read.
    Unreadable(ConfigError),
    /// No hook in these directories runs devgate.
    NoHook(Vec<PathBuf>),
    /// This file runs devgate only for the containers its `when` matches.
    Conditional(PathBuf),
    NoStage,
    StartOnly(PathBuf),
    StopOnly(PathBuf),
}

impl fmt::Display for HooksNotWired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HooksNotWired::Unreadable(e) => write!(f, "cannot read a devgate hook file: {e}"),
            HooksNotWired::NoHook(dirs) => {
                let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                write!(f, "no hook in {} runs devgate", shown.join(", "))
            }
            HooksNotWired::Conditional(c) => write!(
                f,
                "{} runs devgate only for containers matching its `when` (devgate needs \
                 {{\"always\": true}} alone)",
                c.display()
            ),
            HooksNotWired::NoStage => {
                f.write_str("devgate's hook file names no prestart or poststop stage")
            }
            HooksNotWired::StartOnly(p) => write!(
                f,
                "{} runs devgate at start but not at poststop (exit reasons and spare leases \
                 need it)",
                p.display()
            ),
            HooksNotWired::StopOnly(p) => write!(
                f,
                "{} runs devgate at poststop but not at prestart: starts are not gated",
                p.display()
            ),
        }
    }
}

impl std::error::Error for HooksNotWired {}

/// Why a containerd runtime (`name`, starting from the base spec `spec_path`) does not run
/// devgate as it must. `binary` is what the runtime's binary turned out to be, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuntimeNotWired {
    Unreadable {
        name: String,
        spec_path: String,
        why: Box<ConfigError>,
    },
    /// The base spec sets what every container on the node then gets.
    NodeWide {
        name: String,
        spec_path: String,
        set: Vec<&'static str>,
    },
    /// The base spec lacks keys a complete spec has.
    Incomplete {
        name: String,
        spec_path: String,
        missing: Vec<&'static str>,
    },
    /// The hooks run devgate, but under crun, which discards their output.
    CrunHooksAlone {
        name: String,
        spec_path: String,
        binary: String,
    },
    StartOnly {
        name: String,
        spec_path: String,
    },
    StopOnly {
        name: String,
        spec_path: String,
    },
    NoHook {
        name: String,
        spec_path: String,
        binary: String,
    },
    NoBaseSpec {
        name: String,
        binary: String,
    },
}

impl fmt::Display for RuntimeNotWired {
    /// Long because it is one sentence per variant, in the enum's order, each naming the
    /// runtime; split, the sentences would no longer read side by side.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use RuntimeNotWired as R;
        match self {
            R::Unreadable {
                name,
                spec_path,
                why,
            } => write!(
                f,
                "runtime {name}: base_runtime_spec {spec_path}: {why} (the CRI plugin fails to \
                 start)"
            ),
            R::NodeWide {
                name,
                spec_path,
                set,
            } => write!(
                f,
                "runtime {name}: base_runtime_spec {spec_path} sets {}, which every container \
                 on the node then gets (containerd's CRI applies its own defaults only without \
                 a base spec); remove them from the file and restart containerd",
                set.join(", ")
            ),
            R::Incomplete {
                name,
                spec_path,
                missing,
            } => write!(
                f,
                "runtime {name}: base_runtime_spec {spec_path} is not a complete spec (no {}); \
                 containerd reads it at start and uses it whole for every container",
                missing.join(", ")
            ),
            R::CrunHooksAlone {
                name,
                spec_path,
                binary,
            } => write!(
                f,
                "runtime {name} starts from {spec_path}, whose hooks run devgate, but it \
                 {binary} with them alone: crun discards a hook's output, so a reject reaches \
                 kubelet without devgate's line"
            ),
            R::StartOnly { name, spec_path } => write!(
                f,
                "runtime {name}: {spec_path} runs devgate at start but not at poststop"
            ),
            R::StopOnly { name, spec_path } => write!(
                f,
                "runtime {name}: {spec_path} runs devgate at poststop but not at start"
            ),
            R::NoHook {
                name,
                spec_path,
                binary,
            } => write!(
                f,
                "runtime {name}: {spec_path} has no hook that runs devgate, and the runtime \
                 {binary}"
            ),
            R::NoBaseSpec { name, binary } => {
                write!(f, "runtime {name} has no base_runtime_spec and {binary}")
            }
        }
    }
}

impl std::error::Error for RuntimeNotWired {}
