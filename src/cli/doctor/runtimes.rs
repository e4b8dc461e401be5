//! Is each runtime on the node wired to devgate? The pure judges take what was read
//! (oci-hooks files, containerd's `config dump`, CRI-O's and NVIDIA's TOML) and a predicate
//! that says whether a path is devgate; the readers next to them do the bounded I/O.

use crate::wrapper::PROGRAM;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most hook files read from one directory, and the bound on each file.
const MAX_HOOK_FILES: usize = 1000;
const MAX_SMALL_FILE: u64 = 1 << 20;
/// containerd's dump is some tens of KiB; a runaway one is cut here.
const MAX_DUMP: u64 = 8 << 20;
/// `containerd config dump` loads plugins' configs only; seconds mean something is wrong.
const DUMP_DEADLINE: Duration = Duration::from_secs(20);
/// A runtime wrapper script that names devgate is small; larger files are binaries.
const MAX_WRAPPER_SCRIPT: u64 = 64 << 10;

/// containerd's CRI runtime plugin: config version 3 (containerd 2.x) and version 2 (1.x).
pub const CRI_V3: &str = "io.containerd.cri.v1.runtime";
pub const CRI_V2: &str = "io.containerd.grpc.v1.cri";
/// NVIDIA's runtime, and where it lists the runtimes it runs.
pub const NVIDIA_RUNTIME: &str = "nvidia-container-runtime";
pub const NVIDIA_RUNTIME_CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";

/// The files that are devgate: this binary and the usual install paths (the packages' and
/// install-host's), and any the operator names. Compared by device and inode, so a symlink
/// or a hard link to devgate counts and a different file with the same name does not.
#[derive(Debug, Clone)]
pub struct Identity {
    pub this: PathBuf,
    paths: Vec<PathBuf>,
    files: Vec<(u64, u64)>,
}

impl Identity {
    pub fn new(extra: Option<&Path>) -> Identity {
        let this = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        let mut paths = vec![this.clone()];
        if let Some(p) = extra {
            paths.push(p.to_path_buf());
        }
        paths.push("/usr/bin/devgate".into());
        paths.push("/usr/local/bin/devgate".into());
        let files = paths.iter().filter_map(|p| file_id(p)).collect();
        Identity { this, paths, files }
    }

    /// The hook or runtime at `path` is devgate itself.
    pub fn is_devgate(&self, path: &Path) -> bool {
        file_id(path).is_some_and(|id| self.files.contains(&id))
    }

    /// `path` is devgate's runtime wrapper: devgate under the name `devgate-runtime` (the
    /// runtime execs the configured path, and devgate acts as the wrapper only when its
    /// argv[0] has that name), or a small script that runs devgate as `devgate runtime` or
    /// through a `devgate-runtime` link to it.
    pub fn is_wrapper(&self, path: &Path) -> bool {
        if self.is_devgate(path) {
            return path.file_name().is_some_and(|n| n == PROGRAM);
        }
        let Ok(meta) = fs::metadata(path) else {
            return false;
        };
        if !meta.is_file() || meta.len() > MAX_WRAPPER_SCRIPT {
            return false;
        }
        let Ok(text) = fs::read(path) else {
            return false;
        };
        let text = String::from_utf8_lossy(&text);
        text.starts_with("#!")
            && self.paths.iter().filter(|p| self.is_devgate(p)).any(|p| {
                let bin = p.to_string_lossy();
                let link = p.with_file_name(PROGRAM);
                ["", "\"", "'"]
                    .iter()
                    .any(|q| text.contains(&format!("{bin}{q} runtime")))
                    || (self.is_devgate(&link) && text.contains(&*link.to_string_lossy()))
            })
    }
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// `name` as the runtime would find it: a path as given, a bare name through PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Reads a small file, following symlinks as the runtimes do, bounded. Opened
/// non-blocking, so a FIFO planted under a config name cannot hang doctor.
pub fn read_small(path: &Path) -> Result<String, String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut buf = Vec::new();
    f.take(MAX_SMALL_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() as u64 > MAX_SMALL_FILE {
        return Err(format!(
            "{} is larger than {MAX_SMALL_FILE} bytes",
            path.display()
        ));
    }
    String::from_utf8(buf).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

// ---------------------------------------------------------------------------------------
// oci-hooks(5) files, read by CRI-O and podman.

#[derive(Debug, Clone, Deserialize)]
pub struct OciHooksFile {
    /// Required by oci-hooks(5); a file without it is not read by the runtimes either.
    #[allow(dead_code)]
    pub version: String,
    pub hook: HookCmd,
    #[serde(default)]
    pub when: When,
    #[serde(default)]
    pub stages: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HookCmd {
    pub path: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct When {
    pub always: Option<bool>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub commands: Option<Vec<String>>,
    #[serde(rename = "hasBindMounts")]
    pub has_bind_mounts: Option<bool>,
}

impl When {
    /// oci-hooks(5) ANDs the conditions: only `always: true` alone matches every container.
    fn matches_all(&self) -> bool {
        self.always == Some(true)
            && self.annotations.as_ref().map_or(true, |a| a.is_empty())
            && self.commands.as_ref().map_or(true, |c| c.is_empty())
            && self.has_bind_mounts.is_none()
    }
}

/// One `*.json` file from a hooks directory.
#[derive(Debug, Clone)]
pub struct HookFile {
    pub path: PathBuf,
    pub parsed: Result<OciHooksFile, String>,
}

/// Reads every `*.json` in `dirs`; a file in a later directory replaces the one with the
/// same name in an earlier directory, as CRI-O's and podman's hook managers do. A missing
/// directory reads as empty.
pub fn read_hook_dirs(dirs: &[PathBuf]) -> Vec<HookFile> {
    let mut by_name: BTreeMap<String, HookFile> = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .take(MAX_HOOK_FILES)
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let parsed = read_small(&path).and_then(|t| {
                serde_json::from_str::<OciHooksFile>(&t)
                    .map_err(|e| format!("{}: {e}", path.display()))
            });
            by_name.insert(name, HookFile { path, parsed });
        }
    }
    by_name.into_values().collect()
}

/// The stages at which a container's start runs devgate's start check.
const START_STAGES: [&str; 2] = ["prestart", "createRuntime"];

fn runs_devgate_hook(path: &Path, args: &[String], is_devgate: &dyn Fn(&Path) -> bool) -> bool {
    is_devgate(path) && args.iter().any(|a| a == "hook")
}

/// Ok: which file runs devgate, for a ✓ line. Err: why the runtime is not wired.
pub fn judge_hook_files(
    files: &[HookFile],
    dirs: &[PathBuf],
    is_devgate: &dyn Fn(&Path) -> bool,
) -> Result<String, String> {
    let ours: Vec<(&HookFile, &OciHooksFile)> = files
        .iter()
        .filter_map(|f| f.parsed.as_ref().ok().map(|p| (f, p)))
        .filter(|(_, p)| runs_devgate_hook(&p.hook.path, &p.hook.args, is_devgate))
        .collect();
    if ours.is_empty() {
        let broken: Vec<&str> = files
            .iter()
            .filter(|f| f.path.to_string_lossy().contains("devgate"))
            .filter_map(|f| f.parsed.as_ref().err().map(String::as_str))
            .collect();
        if let Some(e) = broken.first() {
            return Err(format!("cannot read a devgate hook file: {e}"));
        }
        let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!("no hook in {} runs devgate", shown.join(", ")));
    }
    let mut start = None;
    let mut stop = None;
    let mut conditional = None;
    for (f, p) in &ours {
        if !p.when.matches_all() {
            conditional = Some(f.path.display().to_string());
            continue;
        }
        if p.stages.iter().any(|s| START_STAGES.contains(&s.as_str())) {
            start.get_or_insert((f, p));
        }
        if p.stages.iter().any(|s| s == "poststop") {
            stop.get_or_insert((f, p));
        }
    }
    match (start, stop) {
        (Some((f, p)), Some((g, _))) => {
            let files = if f.path == g.path {
                f.path.display().to_string()
            } else {
                format!("{} and {}", f.path.display(), g.path.display())
            };
            Ok(format!(
                "{files} runs {} {} at start and poststop",
                p.hook.path.display(),
                hook_args(&p.hook.args)
            ))
        }
        (None, None) => Err(match conditional {
            Some(c) => format!(
                "{c} runs devgate only for containers matching its `when` (devgate needs \
                 {{\"always\": true}} alone)"
            ),
            None => "devgate's hook file names no prestart or poststop stage".into(),
        }),
        (Some((f, _)), None) => Err(format!(
            "{} runs devgate at start but not at poststop (exit reasons and spare leases need it)",
            f.path.display()
        )),
        (None, Some((f, _))) => Err(format!(
            "{} runs devgate at poststop but not at prestart: starts are not gated",
            f.path.display()
        )),
    }
}

/// A hook's arguments past argv[0], for messages.
fn hook_args(args: &[String]) -> String {
    args.iter().skip(1).cloned().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------
// containerd: `containerd config dump` is the merged configuration (the file, its
// `imports` drop-ins, and the built-in defaults) in the daemon's own config version.

/// One runtime of containerd's CRI plugin, as the dump gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CriRuntime {
    pub runtime_type: String,
    pub base_runtime_spec: String,
    pub binary_name: String,
    pub systemd_cgroup: Option<bool>,
}

/// containerd's CRI runtime configuration, from the dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdCri {
    pub version: i64,
    /// The plugin's table name (it differs between config versions).
    pub plugin: &'static str,
    /// The CRI plugin is disabled: kubelet cannot use this containerd.
    pub disabled: bool,
    pub default_runtime: String,
    pub runtimes: BTreeMap<String, CriRuntime>,
}

#[derive(Deserialize)]
struct Dump {
    version: Option<i64>,
    #[serde(default)]
    disabled_plugins: Vec<String>,
    #[serde(default)]
    plugins: BTreeMap<String, toml::Value>,
}

#[derive(Deserialize, Default)]
struct CriPlugin {
    #[serde(default)]
    containerd: CriContainerd,
}

#[derive(Deserialize, Default)]
struct CriContainerd {
    default_runtime_name: Option<String>,
    #[serde(default)]
    runtimes: BTreeMap<String, DumpRuntime>,
}

#[derive(Deserialize)]
struct DumpRuntime {
    #[serde(default)]
    runtime_type: String,
    #[serde(default)]
    base_runtime_spec: String,
    options: Option<DumpRuncOptions>,
}

#[derive(Deserialize)]
struct DumpRuncOptions {
    #[serde(rename = "BinaryName", default)]
    binary_name: String,
    #[serde(rename = "SystemdCgroup")]
    systemd_cgroup: Option<bool>,
}

pub fn parse_containerd_dump(text: &str) -> Result<ContainerdCri, String> {
    let dump: Dump = toml::from_str(text).map_err(|e| one_line_toml(&e))?;
    let (version, plugin) = match dump.version {
        Some(3) => (3, CRI_V3),
        Some(2) => (2, CRI_V2),
        Some(v) => {
            return Err(format!(
                "config version {v} is not one devgate knows (2 or 3)"
            ))
        }
        None => return Err("the dump names no config version".into()),
    };
    let disabled = dump
        .disabled_plugins
        .iter()
        .any(|p| p == "cri" || p == CRI_V2 || p == CRI_V3);
    let cri: CriPlugin = match dump.plugins.get(plugin) {
        Some(v) => v
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| format!("plugins.\"{plugin}\": {}", one_line_toml(&e)))?,
        None => CriPlugin::default(),
    };
    let runtimes = cri
        .containerd
        .runtimes
        .into_iter()
        .map(|(name, r)| {
            let (binary_name, systemd_cgroup) = match r.options {
                Some(o) => (o.binary_name, o.systemd_cgroup),
                None => (String::new(), None),
            };
            (
                name,
                CriRuntime {
                    runtime_type: r.runtime_type,
                    base_runtime_spec: r.base_runtime_spec,
                    binary_name,
                    systemd_cgroup,
                },
            )
        })
        .collect();
    Ok(ContainerdCri {
        version,
        plugin,
        disabled,
        default_runtime: cri
            .containerd
            .default_runtime_name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "runc".into()),
        runtimes,
    })
}

fn one_line_toml(e: &toml::de::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `containerd [--config FILE] config dump` with a deadline and a bound on its output.
pub fn containerd_dump(bin: &Path, config: Option<&Path>) -> Result<String, String> {
    let mut cmd = Command::new(bin);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let mut child = cmd
        .args(["config", "dump"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let out = child.stdout.take();
    let err = child.stderr.take();
    let reader = |pipe: Option<std::process::ChildStdout>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(MAX_DUMP + 1).read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = reader(out);
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = err {
            let _ = p.take(64 << 10).read_to_end(&mut buf);
        }
        buf
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < DUMP_DEADLINE => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} config dump did not finish in {} s",
                    bin.display(),
                    DUMP_DEADLINE.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", bin.display())),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        let said = String::from_utf8_lossy(&stderr);
        let last = said
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!(
            "{} config dump failed ({status}): {}",
            bin.display(),
            last.trim()
        ));
    }
    if stdout.len() as u64 > MAX_DUMP {
        return Err(format!("containerd's dump is larger than {MAX_DUMP} bytes"));
    }
    String::from_utf8(stdout).map_err(|_| "containerd's dump is not UTF-8".into())
}

/// What a base runtime spec file holds, as far as devgate cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseSpec {
    NotSet,
    Unreadable(String),
    /// Keys a complete spec has and this one lacks.
    Incomplete(Vec<&'static str>),
    Complete {
        start: bool,
        stop: bool,
    },
}

#[derive(Deserialize)]
struct SpecShape {
    #[serde(rename = "ociVersion")]
    oci_version: Option<serde::de::IgnoredAny>,
    process: Option<serde::de::IgnoredAny>,
    root: Option<serde::de::IgnoredAny>,
    linux: Option<serde::de::IgnoredAny>,
    hooks: Option<oci_spec::runtime::Hooks>,
}

/// containerd reads the base spec once, at daemon start, and uses it whole as the start of
/// every container's spec: a file holding only hooks makes containers without a process,
/// root or namespaces.
pub fn examine_base_spec(text: &str, is_devgate: &dyn Fn(&Path) -> bool) -> BaseSpec {
    let shape: SpecShape = match serde_json::from_str(text) {
        Ok(s) => s,
        Err(e) => return BaseSpec::Unreadable(format!("not an OCI spec: {e}")),
    };
    let missing: Vec<&'static str> = [
        ("ociVersion", shape.oci_version.is_some()),
        ("process", shape.process.is_some()),
        ("root", shape.root.is_some()),
        ("linux", shape.linux.is_some()),
    ]
    .into_iter()
    .filter(|(_, present)| !present)
    .map(|(k, _)| k)
    .collect();
    if !missing.is_empty() {
        return BaseSpec::Incomplete(missing);
    }
    let runs = |hooks: Option<&Vec<oci_spec::runtime::Hook>>| {
        hooks.is_some_and(|hs| {
            hs.iter().any(|h| {
                runs_devgate_hook(h.path(), h.args().as_deref().unwrap_or(&[]), is_devgate)
            })
        })
    };
    match &shape.hooks {
        None => BaseSpec::Complete {
            start: false,
            stop: false,
        },
        Some(h) => {
            #[allow(deprecated)]
            let prestart = h.prestart().as_ref();
            BaseSpec::Complete {
                start: runs(prestart) || runs(h.create_runtime().as_ref()),
                stop: runs(h.poststop().as_ref()),
            }
        }
    }
}

/// What a runtime's binary (containerd's BinaryName, CRI-O's runtime_path) turns out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binary {
    /// Unset: the shim's default, runc.
    Default,
    DevgateWrapper(PathBuf),
    /// devgate under another name than `devgate-runtime`: it would take the runtime's
    /// arguments for devgate's own command line and fail every container.
    DevgateMisnamed(PathBuf),
    /// NVIDIA's runtime, and the low-level runtime it would run (devgate's wrapper or not).
    Nvidia {
        path: PathBuf,
        runs: Result<PathBuf, String>,
        runs_devgate: bool,
    },
    Other(PathBuf),
}

/// The base name of NVIDIA's runtime (also as `nvidia-container-runtime.cdi` and the like).
pub fn is_nvidia_runtime(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(NVIDIA_RUNTIME))
}

#[derive(Deserialize)]
struct NvidiaConfig {
    #[serde(rename = "nvidia-container-runtime", default)]
    runtime: NvidiaRuntimeSection,
}

#[derive(Deserialize, Default)]
struct NvidiaRuntimeSection {
    #[serde(default)]
    runtimes: Vec<String>,
}

/// The candidates NVIDIA's runtime tries, in order (`nvidia-container-runtime.runtimes`);
/// its built-in list when the file does not set one.
pub fn nvidia_runtime_candidates(text: Option<&str>) -> Result<Vec<String>, String> {
    let listed = match text {
        Some(t) => {
            toml::from_str::<NvidiaConfig>(t)
                .map_err(|e| one_line_toml(&e))?
                .runtime
                .runtimes
        }
        None => Vec::new(),
    };
    if listed.is_empty() {
        return Ok(vec!["docker-runc".into(), "runc".into(), "crun".into()]);
    }
    Ok(listed)
}

/// Classifies a configured runtime binary; for NVIDIA's, reads its config (`nvidia_config`)
/// and resolves the first candidate it would run.
pub fn classify_binary(name: &str, id: &Identity, nvidia_config: &Path) -> Binary {
    if name.is_empty() {
        return Binary::Default;
    }
    let path = which(name).unwrap_or_else(|| PathBuf::from(name));
    if id.is_wrapper(&path) {
        return Binary::DevgateWrapper(path);
    }
    if id.is_devgate(&path) {
        return Binary::DevgateMisnamed(path);
    }
    if is_nvidia_runtime(&path) {
        let text = match fs::symlink_metadata(nvidia_config) {
            Ok(_) => match read_small(nvidia_config) {
                Ok(t) => Some(t),
                Err(e) => {
                    return Binary::Nvidia {
                        path,
                        runs: Err(e),
                        runs_devgate: false,
                    }
                }
            },
            Err(_) => None,
        };
        let runs = nvidia_runtime_candidates(text.as_deref())
            .map_err(|e| format!("{}: {e}", nvidia_config.display()))
            .and_then(|c| {
                c.iter()
                    .find_map(|r| which(r))
                    .ok_or_else(|| format!("none of its runtimes ({}) is installed", c.join(", ")))
            });
        let runs_devgate = runs.as_ref().is_ok_and(|p| id.is_wrapper(p));
        return Binary::Nvidia {
            path,
            runs,
            runs_devgate,
        };
    }
    Binary::Other(path)
}

impl Binary {
    pub fn runs_devgate(&self) -> bool {
        match self {
            Binary::DevgateWrapper(_) => true,
            Binary::Nvidia { runs_devgate, .. } => *runs_devgate,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Binary::Default => "runs runc".into(),
            Binary::DevgateWrapper(p) => {
                format!("runs devgate's runtime wrapper {}", p.display())
            }
            Binary::DevgateMisnamed(p) => format!(
                "runs devgate as {}, which is the runtime wrapper only when named {PROGRAM} \
                 (a link to devgate) or run as `devgate runtime`",
                p.display()
            ),
            Binary::Nvidia { path, runs, .. } => match runs {
                Ok(r) => format!(
                    "runs NVIDIA's runtime {}, which runs {}",
                    path.display(),
                    r.display()
                ),
                Err(e) => format!("runs NVIDIA's runtime {} ({e})", path.display()),
            },
            Binary::Other(p) => format!("runs {}", p.display()),
        }
    }
}

/// The judgement on one containerd runtime: Ok(detail) or Err(why not wired).
pub fn judge_containerd_runtime(
    name: &str,
    rt: &CriRuntime,
    spec: &BaseSpec,
    binary: &Binary,
) -> Result<String, String> {
    let spec_path = &rt.base_runtime_spec;
    match spec {
        BaseSpec::Unreadable(e) => {
            return Err(format!(
                "runtime {name}: base_runtime_spec {spec_path}: {e} (the CRI plugin fails to \
                 start)"
            ))
        }
        BaseSpec::Incomplete(missing) => {
            return Err(format!(
                "runtime {name}: base_runtime_spec {spec_path} is not a complete spec (no {}); \
                 containerd reads it at start and uses it whole for every container",
                missing.join(", ")
            ))
        }
        _ => {}
    }
    let hooks = match spec {
        BaseSpec::Complete { start, stop } => Some((*start, *stop)),
        _ => None,
    };
    if binary.runs_devgate() {
        // The wrapper gates and remaps; only the poststop hook reports faults of a run.
        let note = match hooks {
            Some((_, true)) => "",
            _ => "; no base_runtime_spec hook runs devgate at poststop, so faults during a run go unreported",
        };
        return Ok(format!("runtime {name} {}{note}", binary.describe()));
    }
    match hooks {
        Some((true, true)) => Ok(format!(
            "runtime {name} starts from {spec_path}, a complete spec whose hooks run devgate at \
             start and poststop"
        )),
        Some((true, false)) => Err(format!(
            "runtime {name}: {spec_path} runs devgate at start but not at poststop"
        )),
        Some((false, true)) => Err(format!(
            "runtime {name}: {spec_path} runs devgate at poststop but not at start"
        )),
        Some((false, false)) => Err(format!(
            "runtime {name}: {spec_path} has no hook that runs devgate, and the runtime {}",
            binary.describe()
        )),
        None => Err(format!(
            "runtime {name} has no base_runtime_spec and {}",
            binary.describe()
        )),
    }
}

/// The fix line for an unwired containerd.
pub fn containerd_fix(cri: &ContainerdCri, runtime: &str, fix: &super::FixCmd) -> String {
    format!(
        "{}, set base_runtime_spec = \"/etc/containerd/devgate-base-spec.json\" under \
         [plugins.\"{}\".containerd.runtimes.{runtime}], and restart containerd",
        fix.hooks_config("containerd", Path::new("/etc/containerd")),
        cri.plugin
    )
}

// ---------------------------------------------------------------------------------------
// CRI-O: crio.conf and its drop-ins, later files overriding the keys they set.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrioConfig {
    pub hooks_dir: Option<Vec<PathBuf>>,
    pub cgroup_manager: Option<String>,
    pub default_runtime: Option<String>,
    pub runtime_paths: BTreeMap<String, String>,
}

/// CRI-O's own default hooks directory (containers/common's DefaultHooksDirs); unlike
/// podman, CRI-O does not add /etc/containers/oci/hooks.d unless hooks_dir names it.
pub const CRIO_DEFAULT_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

#[derive(Deserialize, Default)]
struct CrioFile {
    #[serde(default)]
    crio: CrioTop,
}

#[derive(Deserialize, Default)]
struct CrioTop {
    #[serde(default)]
    runtime: CrioRuntime,
}

#[derive(Deserialize, Default)]
struct CrioRuntime {
    hooks_dir: Option<Vec<PathBuf>>,
    cgroup_manager: Option<String>,
    default_runtime: Option<String>,
    #[serde(default)]
    runtimes: BTreeMap<String, CrioRuntimeHandler>,
}

#[derive(Deserialize)]
struct CrioRuntimeHandler {
    runtime_path: Option<String>,
}

/// Merges CRI-O's files in the order CRI-O reads them (crio.conf, then the drop-ins sorted).
pub fn parse_crio(files: &[(PathBuf, String)]) -> Result<CrioConfig, String> {
    let mut c = CrioConfig::default();
    for (path, text) in files {
        let f: CrioFile = toml::from_str(text)
            .map_err(|e| format!("{}: {}", path.display(), one_line_toml(&e)))?;
        let r = f.crio.runtime;
        if r.hooks_dir.is_some() {
            c.hooks_dir = r.hooks_dir;
        }
        if r.cgroup_manager.is_some() {
            c.cgroup_manager = r.cgroup_manager;
        }
        if r.default_runtime.is_some() {
            c.default_runtime = r.default_runtime;
        }
        for (name, h) in r.runtimes {
            if let Some(p) = h.runtime_path {
                c.runtime_paths.insert(name, p);
            }
        }
    }
    Ok(c)
}

/// crio.conf and the drop-ins beside it (`crio.conf.d/*.conf`, sorted).
pub fn read_crio(main: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let mut files = Vec::new();
    if fs::symlink_metadata(main).is_ok() {
        files.push((main.to_path_buf(), read_small(main)?));
    }
    let dropins = main.with_extension("conf.d");
    if let Ok(entries) = fs::read_dir(&dropins) {
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .take(MAX_HOOK_FILES)
            .collect();
        paths.sort();
        for p in paths {
            let t = read_small(&p)?;
            files.push((p, t));
        }
    }
    Ok(files)
}

// ---------------------------------------------------------------------------------------
// kubelet's cgroup driver, from its KubeletConfiguration (YAML). devgate reads only the one
// top-level scalar it needs rather than carrying a YAML parser.

/// `Some(driver)` when the file sets `cgroupDriver`; kubelet's default is cgroupfs.
pub fn kubelet_cgroup_driver(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("cgroupDriver:")?;
        let v = rest.split('#').next()?.trim().trim_matches(['"', '\'']);
        (!v.is_empty()).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devgate_at(p: &'static str) -> impl Fn(&Path) -> bool {
        move |x: &Path| x == Path::new(p)
    }

    fn file(path: &str, json: &str) -> HookFile {
        HookFile {
            path: path.into(),
            parsed: serde_json::from_str(json).map_err(|e| e.to_string()),
        }
    }

    #[test]
    fn hook_files_wired_and_not() {
        let dg = devgate_at("/usr/bin/devgate");
        let dirs = vec![PathBuf::from("/h1"), PathBuf::from("/h2")];
        let good = file(
            "/h2/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","auto"]},
               "when":{"always":true},"stages":["prestart","poststop"]}"#,
        );
        assert_eq!(
            judge_hook_files(std::slice::from_ref(&good), &dirs, &dg).unwrap(),
            "/h2/devgate.json runs /usr/bin/devgate hook auto at start and poststop"
        );
        assert_eq!(
            judge_hook_files(&[], &dirs, &dg).unwrap_err(),
            "no hook in /h1, /h2 runs devgate"
        );
        let other = file(
            "/h1/x.json",
            r#"{"version":"1.0.0","hook":{"path":"/bin/true"},"when":{"always":true},"stages":["prestart"]}"#,
        );
        assert!(judge_hook_files(&[other], &dirs, &dg).is_err());
        let pre_only = file(
            "/h1/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","prestart"]},
               "when":{"always":true},"stages":["prestart"]}"#,
        );
        assert!(judge_hook_files(&[pre_only], &dirs, &dg)
            .unwrap_err()
            .contains("not at poststop"));
        let conditional = file(
            "/h1/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","auto"]},
               "when":{"always":true,"commands":["sh"]},"stages":["prestart","poststop"]}"#,
        );
        assert!(judge_hook_files(&[conditional], &dirs, &dg)
            .unwrap_err()
            .contains("only for containers matching its `when`"));
        let broken = file("/h1/devgate.json", "{");
        assert!(judge_hook_files(&[broken], &dirs, &dg)
            .unwrap_err()
            .starts_with("cannot read a devgate hook file"));
    }

    /// The shape containerd 2.x prints: config version 3 and the runtime plugin's table.
    const DUMP_V3: &str = r#"
version = 3
disabled_plugins = []
imports = ["/etc/containerd/conf.d/devgate.toml"]

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          base_runtime_spec = '/etc/containerd/devgate-base-spec.json'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            SystemdCgroup = true
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
            BinaryName = '/usr/bin/nvidia-container-runtime'
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
"#;

    #[test]
    fn containerd_dump_v3_and_v2() {
        let c = parse_containerd_dump(DUMP_V3).unwrap();
        assert_eq!(c.version, 3);
        assert_eq!(c.plugin, CRI_V3);
        assert!(!c.disabled);
        assert_eq!(c.default_runtime, "runc");
        let runc = &c.runtimes["runc"];
        assert_eq!(
            runc.base_runtime_spec,
            "/etc/containerd/devgate-base-spec.json"
        );
        assert_eq!(runc.systemd_cgroup, Some(true));
        assert_eq!(
            c.runtimes["nvidia"].binary_name,
            "/usr/bin/nvidia-container-runtime"
        );

        let v2 = r#"
version = 2
disabled_plugins = ["cri"]
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
"#;
        let c = parse_containerd_dump(v2).unwrap();
        assert_eq!((c.version, c.plugin, c.disabled), (2, CRI_V2, true));
        assert_eq!(c.default_runtime, "nvidia");
        assert_eq!(c.runtimes["runc"].base_runtime_spec, "");
        assert_eq!(c.runtimes["runc"].systemd_cgroup, None);

        assert!(parse_containerd_dump("version = 1\n")
            .unwrap_err()
            .contains("config version 1"));
        assert!(parse_containerd_dump("version = [\n").is_err());
    }

    #[test]
    fn base_spec_must_be_complete() {
        let dg = devgate_at("/usr/bin/devgate");
        let hooks = r#""hooks":{"prestart":[{"path":"/usr/bin/devgate","args":["devgate","hook","prestart"]}],
                       "poststop":[{"path":"/usr/bin/devgate","args":["devgate","hook","poststop"]}]}"#;
        assert_eq!(
            examine_base_spec(&format!("{{{hooks}}}"), &dg),
            BaseSpec::Incomplete(vec!["ociVersion", "process", "root", "linux"])
        );
        let full = format!(
            r#"{{"ociVersion":"1.1.0","process":{{"cwd":"/","user":{{"uid":0,"gid":0}}}},"root":{{"path":"rootfs"}},"linux":{{}},{hooks}}}"#
        );
        assert_eq!(
            examine_base_spec(&full, &dg),
            BaseSpec::Complete {
                start: true,
                stop: true
            }
        );
        let other = devgate_at("/opt/devgate");
        assert_eq!(
            examine_base_spec(&full, &other),
            BaseSpec::Complete {
                start: false,
                stop: false
            }
        );
        assert!(matches!(
            examine_base_spec("[]", &dg),
            BaseSpec::Unreadable(_)
        ));
    }

    /// devgate is the wrapper only as `devgate-runtime` (its argv[0]) or run as
    /// `devgate runtime`: under any other name it would read the runtime's arguments as
    /// its own command line.
    #[test]
    fn the_wrapper_is_devgate_named_devgate_runtime_or_a_script_running_it() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("devgate-doctor-id-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("devgate");
        fs::write(&bin, b"\x7fELF").unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        let id = Identity::new(Some(&bin));
        let script = |name: &str, body: String| {
            let p = dir.join(name);
            fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let link = dir.join("devgate-runtime");
        symlink("devgate", &link).unwrap();
        let other = dir.join("devgate-runc");
        symlink("devgate", &other).unwrap();
        assert!(id.is_wrapper(&link));
        assert!(id.is_devgate(&other) && !id.is_wrapper(&other));
        assert!(!id.is_wrapper(&bin));
        let nv = dir.join("nvidia.toml");
        let classify = |p: &Path| classify_binary(p.to_str().unwrap(), &id, &nv);
        assert_eq!(classify(&link), Binary::DevgateWrapper(link.clone()));
        assert_eq!(classify(&other), Binary::DevgateMisnamed(other.clone()));
        let b = bin.display();
        for (name, body, wrapper) in [
            ("s1", format!("exec {b} runtime \"$@\""), true),
            ("s2", format!("exec \"{b}\" runtime \"$@\""), true),
            ("s3", format!("exec {} \"$@\"", link.display()), true),
            ("s4", format!("exec {b} \"$@\""), false),
            ("s5", "exec /usr/sbin/runc \"$@\"".to_string(), false),
        ] {
            assert_eq!(
                id.is_wrapper(&script(name, body.clone())),
                wrapper,
                "{body}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn containerd_runtime_judgement() {
        let rt = CriRuntime {
            runtime_type: "io.containerd.runc.v2".into(),
            base_runtime_spec: "/s.json".into(),
            ..Default::default()
        };
        let ok = BaseSpec::Complete {
            start: true,
            stop: true,
        };
        assert!(judge_containerd_runtime("runc", &rt, &ok, &Binary::Default).is_ok());
        let wrapper = Binary::DevgateWrapper("/usr/bin/devgate-runc".into());
        assert_eq!(
            judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &wrapper).unwrap(),
            "runtime runc runs devgate's runtime wrapper /usr/bin/devgate-runc; no \
             base_runtime_spec hook runs devgate at poststop, so faults during a run go unreported"
        );
        assert_eq!(
            judge_containerd_runtime("runc", &rt, &ok, &wrapper).unwrap(),
            "runtime runc runs devgate's runtime wrapper /usr/bin/devgate-runc"
        );
        let misnamed = Binary::DevgateMisnamed("/usr/bin/devgate".into());
        let e = judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &misnamed).unwrap_err();
        assert!(
            e.ends_with("runs devgate as /usr/bin/devgate, which is the runtime wrapper only when named devgate-runtime (a link to devgate) or run as `devgate runtime`"),
            "{e}"
        );
        // An incomplete spec fails even with the wrapper: containerd would use it whole.
        let e = judge_containerd_runtime(
            "runc",
            &rt,
            &BaseSpec::Incomplete(vec!["process"]),
            &wrapper,
        )
        .unwrap_err();
        assert!(e.contains("not a complete spec (no process)"), "{e}");
        let e =
            judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &Binary::Default).unwrap_err();
        assert_eq!(e, "runtime runc has no base_runtime_spec and runs runc");
        let nv = Binary::Nvidia {
            path: "/usr/bin/nvidia-container-runtime".into(),
            runs: Ok("/usr/bin/runc".into()),
            runs_devgate: false,
        };
        let e = judge_containerd_runtime("nvidia", &rt, &BaseSpec::NotSet, &nv).unwrap_err();
        assert!(e.ends_with("which runs /usr/bin/runc"), "{e}");
    }

    #[test]
    fn nvidia_candidates() {
        assert_eq!(
            nvidia_runtime_candidates(Some(
                "[nvidia-container-runtime]\nruntimes = [\"/usr/bin/devgate-runc\", \"runc\"]\n"
            ))
            .unwrap(),
            ["/usr/bin/devgate-runc", "runc"]
        );
        assert_eq!(
            nvidia_runtime_candidates(None).unwrap(),
            ["docker-runc", "runc", "crun"]
        );
    }

    #[test]
    fn crio_files_merge_in_order() {
        let c = parse_crio(&[
            (
                "/etc/crio/crio.conf".into(),
                "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\nhooks_dir = [\"/a\"]\n".into(),
            ),
            (
                "/etc/crio/crio.conf.d/10-x.conf".into(),
                "[crio.runtime]\nhooks_dir = [\"/b\", \"/c\"]\ndefault_runtime = \"dg\"\n\
                 [crio.runtime.runtimes.dg]\nruntime_path = \"/usr/bin/devgate-runc\"\n"
                    .into(),
            ),
        ])
        .unwrap();
        assert_eq!(c.cgroup_manager.as_deref(), Some("cgroupfs"));
        assert_eq!(
            c.hooks_dir,
            Some(vec![PathBuf::from("/b"), PathBuf::from("/c")])
        );
        assert_eq!(c.runtime_paths["dg"], "/usr/bin/devgate-runc");
        assert!(parse_crio(&[("/x".into(), "[crio\n".into())])
            .unwrap_err()
            .starts_with("/x: "));
    }

    #[test]
    fn kubelet_driver_line() {
        assert_eq!(
            kubelet_cgroup_driver(
                "apiVersion: kubelet.config.k8s.io/v1beta1\ncgroupDriver: \"systemd\" # kubeadm\n"
            )
            .as_deref(),
            Some("systemd")
        );
        assert_eq!(kubelet_cgroup_driver("  cgroupDriver: systemd\n"), None);
        assert_eq!(kubelet_cgroup_driver("kind: KubeletConfiguration\n"), None);
    }
}
