//! `devgate install-host`: copies devgate, its hook files and its config onto a host
//! mounted at `--root` (the Kubernetes DaemonSet installer).

use super::conffile::{say_laid, Conffile, RECORD_DIR};
use super::crun_wrap::{self, ConfigRuntime};
use super::enable::{self, Changes};
use super::hooks_config::File;
use super::hooks_config::{
    absolute, ensure_dir, files, write_files, Runtime, Target, CONTAINERD_BASE_SPEC_NAME,
    DEFAULT_CONFIG, HOST_HOOKS_DIR, PACKAGE_HOOKS_DIR,
};
use super::host_opts::{target_of, Opts};
use super::runtime_confs::named_by_runtime_config;
use super::wrapper_config;
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, write_atomic};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where containerd's config and devgate's base spec live on the host.
pub(super) const CONTAINERD_DIR: &str = "/etc/containerd";
/// Where the snippets go on the host, as the packages lay them.
pub(super) const SHARE_DIR: &str = "/usr/share/devgate";
/// containerd's config snippets among them (named by the DaemonSet's notes).
const SNIPPET_DIR: &str = "/usr/share/devgate/containerd";

pub(super) use super::host_exec::under;

/// The base spec `name` on the host at `root`, with its install record.
pub(super) struct BaseSpec {
    pub path: PathBuf,
    pub record: PathBuf,
}

impl BaseSpec {
    pub(super) fn lay(&self, ours: &[u8]) -> Result<super::conffile::Laid> {
        self.conffile().lay(ours)
    }

    pub(super) fn conffile(&self) -> Conffile<'_> {
        Conffile {
            path: &self.path,
            record: &self.record,
        }
    }
}

pub(super) fn base_spec(root: &Path, name: &str) -> BaseSpec {
    BaseSpec {
        path: under(root, Path::new(CONTAINERD_DIR)).join(name),
        record: under(root, Path::new(RECORD_DIR)).join(name),
    }
}

/// containerd's config snippets (versions 2 and 3), as the repository ships them.
fn snippets() -> Vec<File> {
    [
        (
            "config.toml",
            include_str!("../../hooks/containerd/config.toml"),
        ),
        (
            "config-v3.toml",
            include_str!("../../hooks/containerd/config-v3.toml"),
        ),
    ]
    .into_iter()
    .map(|(name, content)| File {
        name: name.into(),
        content: content.into(),
    })
    .collect()
}

/// The snippets install-host lays under [`SHARE_DIR`], by directory (on the host).
pub(super) fn shared_files(target: &Target) -> Result<Vec<(PathBuf, Vec<File>)>> {
    let mut out = vec![(PathBuf::from(SNIPPET_DIR), snippets())];
    for (runtime, dir) in [
        (Runtime::Containerd, "containerd"),
        (Runtime::Crio, "crio"),
        (Runtime::Podman, "podman"),
    ] {
        let files = wrapper_config::files(runtime, target)?;
        out.push((Path::new(SHARE_DIR).join(dir), files));
    }
    Ok(out)
}

const INSTALL_HOST_USAGE: &str = "usage: devgate install-host --root DIR [--prefix DIR] \
[--config-file PATH] [--hooks-dir DIR] [--enable [--restart]]";

/// Copies the program at `src` (`what`, for the error) to `dst` (mode 0755, atomically)
/// and says so.
fn install_program(what: &str, src: &Path, dst: &Path) -> Result<()> {
    let bytes = fs::read(src).map_err(|e| Error::io(format!("cannot read {what}"), src, e))?;
    write_atomic(dst, &bytes, 0o755)?;
    say!("devgate: installed {}", dst.display());
    Ok(())
}

/// `dst`'s program from beside this devgate, or a link to devgate where it is not there.
fn install_companion(what: &str, dst: &Path) -> Result<()> {
    let name = dst.file_name().unwrap_or_default();
    let program = std::env::current_exe()
        .ok()
        .map(|me| me.with_file_name(name))
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file()));
    match program {
        Some(src) => install_program(what, &src, dst),
        None => {
            wrapper_config::link_to_devgate(dst)?;
            say!("devgate: installed {} -> devgate", dst.display());
            Ok(())
        }
    }
}

/// Lays devgate onto a host mounted at `--root` (the Kubernetes installer's entrypoint):
/// the running binary to ROOT/PREFIX/bin/devgate, the oci-hooks files to
/// ROOT/usr/share/containers/oci/hooks.d (what podman and CRI-O read unless hooks_dir
/// names others; another with `--hooks-dir`), the containerd base spec to
/// ROOT/etc/containerd/devgate-base-spec.json, the quarantine directory, and the config:
/// `--config-file` replaces ROOT/etc/devgate/config.json (a ConfigMap is the operator's
/// config); without it the default is written only where none exists.
pub(super) fn install_host(o: &Opts) -> Result<()> {
    let root = checked_root(o)?;
    let target = target_of(o, "/usr/local")?;
    // A config from --config-file is checked before anything on the host changes.
    let given = given_config(o)?;
    install_programs(root, &target)?;
    install_hook_files(root, o, &target)?;
    // What a restart may have to put back: the spec, its record, containerd's config.
    let mut changes = Changes::default();
    install_containerd_files(root, &target, &mut changes)?;
    let wrapper = wrapper_config::wrapper_path(&target);
    let crun = match o.enable {
        true => crun_plan(root, &target)?,
        false => None,
    };
    let wrapper_runs = crun.is_some()
        && named_by_runtime_config(
            root,
            std::slice::from_ref(&wrapper),
            &crun_wrap::dropins(root),
        )
        .is_some();
    let crun_path = crun.as_ref().map(|(_, p)| p.as_str());
    let (config, runs_crun) = install_config(root, &target, given, crun_path, wrapper_runs)?;
    let crun = crun.map(|(found, _)| found);
    let quarantine = under(root, &config.quarantine_dir);
    ensure_private_dir(&quarantine)?;
    say!("devgate: quarantine directory {}", quarantine.display());
    // Last: the runtimes are pointed at devgate only once everything they name is there.
    let mut crun_changes = Changes::default();
    if o.enable {
        let spec = Path::new(CONTAINERD_DIR).join(CONTAINERD_BASE_SPEC_NAME);
        let crun_wrapper = crun
            .as_ref()
            .filter(|f| runs_crun && f.containerd.is_some())
            .map(|_| wrapper.as_path());
        enable::edit_config(root, Some(&spec), crun_wrapper, &mut changes)?;
        if let (Some(found), true) = (&crun, runs_crun) {
            crun_wrap::enable(root, &wrapper, found, &mut crun_changes)?;
        }
    }
    if o.restart {
        enable::restart(root, &changes, "devgate is on")?;
        crun_wrap::restart_crio(root, &crun_changes)
    } else if o.enable {
        enable::say_restart_needed(&changes)?;
        crun_wrap::say_restart_needed(&crun_changes)
    } else {
        Ok(())
    }
}

/// The config `text` where the wrapper is to run crun: (its text, whether its wrapper runs
/// crun, whether runtime.path was added). `wrapper_runs`: another runtime runs the wrapper
/// already, in front of what the config names now.
fn with_crun(
    text: Vec<u8>,
    crun: &str,
    wrapper_runs: bool,
    cfg_path: &Path,
) -> Result<(Vec<u8>, bool, bool)> {
    Ok(match crun_wrap::config_runtime(&text, crun)? {
        ConfigRuntime::Crun => (text, true, false),
        ConfigRuntime::Add(_) if wrapper_runs => {
            say!(
                "devgate: a runtime here already runs devgate-runtime in front of runc \
                 (runtime.path unset): crun keeps devgate's hooks alone; set runtime.path \
                 in {} to run both through it",
                cfg_path.display()
            );
            (text, false, false)
        }
        ConfigRuntime::Add(new) => (new, true, true),
        ConfigRuntime::Other(p) => {
            say!(
                "devgate: {} names runtime.path {p:?}, not crun: crun keeps devgate's hooks \
                 alone",
                cfg_path.display()
            );
            (text, false, false)
        }
    })
}

/// The managers whose crun gets devgate's wrapper in front (`--enable`), and what
/// runtime.path names crun by, where the wrapper can read devgate's config (it is started
/// with no environment of the caller's, so it reads the default config only) and find crun.
fn crun_plan(root: &Path, target: &Target) -> Result<Option<(crun_wrap::CrunRuntimes, String)>> {
    let found = crun_wrap::find(root)?;
    if !found.any() {
        return Ok(None);
    }
    let Some(crun) = crun_wrap::crun_for_wrapper(root, &found) else {
        say!(
            "devgate: no crun here where devgate-runtime looks ({}) or the runtimes name it: \
             crun keeps devgate's hooks alone",
            crate::wrapper::runtime::SEARCH_DIRS.join(":")
        );
        return Ok(None);
    };
    match target.config.as_deref() {
        Some(c) if c != Path::new(config::DEFAULT_PATH) => {
            say!(
                "devgate: devgate-runtime reads {}, not {}: crun keeps devgate's hooks alone",
                config::DEFAULT_PATH,
                c.display()
            );
            Ok(None)
        }
        _ => Ok(Some((found, crun))),
    }
}

/// The host root install-host lays onto, once the options are install-host's and a host
/// asked to restart containerd can.
fn checked_root(o: &Opts) -> Result<&Path> {
    if o.runtime.is_some() || o.bin.is_some() || o.out.is_some() || o.wrapper || o.programs {
        return Err(Error::Usage(format!(
            "--runtime, --bin, --out, --wrapper and --programs are not install-host's options; \
             {INSTALL_HOST_USAGE}"
        )));
    }
    let root = enable::host_root(o, INSTALL_HOST_USAGE)?;
    if o.restart && !o.enable {
        return Err(Error::Usage(format!(
            "--restart goes with --enable; {INSTALL_HOST_USAGE}"
        )));
    }
    enable::check_restart(o, root)?;
    Ok(root)
}

/// The config `--config-file` names, read and parsed: its path, its bytes, the config.
fn given_config(o: &Opts) -> Result<Option<(&Path, Vec<u8>, Config)>> {
    let Some(src) = &o.config_file else {
        return Ok(None);
    };
    let text = fs::read(src).map_err(|e| Error::io("cannot read config", src, e))?;
    let parsed = Config::parse(&text, src)?;
    Ok(Some((src, text, parsed)))
}

/// devgate itself, then the runtime wrapper and the hook front beside it.
fn install_programs(root: &Path, target: &Target) -> Result<()> {
    let bin = under(root, &target.bin);
    if let Some(dir) = bin.parent() {
        ensure_dir(dir)?;
    }
    install_program("own binary", Path::new("/proc/self/exe"), &bin)?;
    // The runtime wrapper and the hook front: the programs beside this devgate
    // (statically linked: src/runtime_main.rs, src/hook_main.rs) where they are there,
    // else links to devgate, which does their jobs when started by their names.
    install_companion(
        "the wrapper program",
        &under(root, &wrapper_config::wrapper_path(target)),
    )?;
    install_companion("the hook front", &under(root, &target.hook))
}

/// The oci-hooks files, into `--hooks-dir` (default: the packages' directory).
fn install_hook_files(root: &Path, o: &Opts, target: &Target) -> Result<()> {
    let hooks_dir = o
        .hooks_dir
        .as_deref()
        .unwrap_or(Path::new(PACKAGE_HOOKS_DIR));
    absolute("--hooks-dir", hooks_dir)?;
    let hook_files = files(Runtime::Crio, target)?;
    // Older installs wrote HOST_HOOKS_DIR, which runtimes read only where hooks_dir names
    // it; where such a file is there, it is refreshed too (the same name: a runtime reading
    // both directories runs it once).
    let old = under(root, Path::new(HOST_HOOKS_DIR));
    let refresh_old = o.hooks_dir.is_none()
        && hook_files
            .iter()
            .any(|f| fs::symlink_metadata(old.join(&f.name)).is_ok());
    let mut dirs = vec![under(root, hooks_dir)];
    if refresh_old {
        dirs.push(old);
    }
    for dir in dirs {
        for p in write_files(&dir, &hook_files)? {
            say!("devgate: installed {}", p.display());
        }
    }
    Ok(())
}

/// The base spec, and the snippets for containerd's config and the runtime wrapper.
fn install_containerd_files(root: &Path, target: &Target, changes: &mut Changes) -> Result<()> {
    // The base spec last, after the programs its hooks name: a containerd that names it
    // and restarts now runs programs that are there.
    for f in files(Runtime::Containerd, target)? {
        ensure_dir(&under(root, Path::new(CONTAINERD_DIR)))?;
        let spec = base_spec(root, &f.name);
        changes.keep(&spec.path)?;
        changes.keep(&spec.record)?;
        say_laid(&spec.lay(f.content.as_bytes())?);
    }
    // The snippets the operator or the node image merges into containerd's config, and
    // the runtime wrapper's for each manager (crun discards a hook's output: where crun
    // runs, the wrapper carries devgate's line; docs/install.md), named for this prefix.
    for (dir, files) in shared_files(target)? {
        for p in write_files(&under(root, &dir), &files)? {
            say!("devgate: installed {}", p.display());
        }
    }
    Ok(())
}

/// The config: the given one replaces the host's, else the host's is kept, else the
/// default is written. With `crun` (install-host will put devgate's wrapper in front of
/// crun), a config that names no runtime gets `runtime.path` `crun` in the same write, unless
/// `wrapper_runs` (another runtime already runs the wrapper, in front of runc). Returns the
/// config the host now has, and whether its wrapper runs crun.
fn install_config(
    root: &Path,
    target: &Target,
    given: Option<(&Path, Vec<u8>, Config)>,
    crun: Option<&str>,
    wrapper_runs: bool,
) -> Result<(Config, bool)> {
    let cfg_path = under(
        root,
        target
            .config
            .as_deref()
            .unwrap_or(Path::new(config::DEFAULT_PATH)),
    );
    let cfg_dir = cfg_path
        .parent()
        .ok_or_else(|| Error::invalid("config path", "has no parent"))?;
    ensure_dir(cfg_dir)?;
    let (text, said, write) = match given {
        Some((src, text, _)) => (
            text,
            format!("installed {} from {}", cfg_path.display(), src.display()),
            true,
        ),
        None => match fs::symlink_metadata(&cfg_path) {
            Ok(_) => (
                fs::read(&cfg_path).map_err(|e| Error::io("cannot read config", &cfg_path, e))?,
                format!("kept existing {}", cfg_path.display()),
                false,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (
                DEFAULT_CONFIG.as_bytes().to_vec(),
                format!("installed default {}", cfg_path.display()),
                true,
            ),
            Err(e) => return Err(Error::io("cannot stat config", &cfg_path, e)),
        },
    };
    let (text, runs_crun, added) = match crun {
        None => (text, false, false),
        Some(crun) => with_crun(text, crun, wrapper_runs, &cfg_path)?,
    };
    let parsed = Config::parse(&text, &cfg_path)?;
    if write || added {
        write_atomic(&cfg_path, &text, 0o644)?;
    }
    say!("devgate: {said}");
    if added {
        say!(
            "devgate: {} names runtime.path crun: devgate-runtime runs crun",
            cfg_path.display()
        );
    }
    Ok((parsed, runs_crun))
}
