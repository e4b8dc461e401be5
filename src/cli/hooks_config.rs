//! The runtime configuration that makes runtimes call devgate, generated for an install
//! prefix so node image builders never hand-edit paths:
//!
//! - CRI-O and podman read oci-hooks(5) files (version 1.0.0) from hooks.d directories. One
//!   file holds one hook with one argument list for all its stages, so `devgate.json` runs
//!   `devgate hook auto` for prestart and poststop, and devgate takes the stage from the
//!   state's status (`stopped` at poststop).
//! - containerd has no hooks directory: its CRI plugin starts every container from a base
//!   runtime spec (`base_runtime_spec` in config.toml), so devgate ships a full default spec,
//!   as containerd 1.6 generates it, without what the CRI would give every container from it
//!   (rlimits, seccomp, AppArmor), with devgate's hooks added.
//!
//! `devgate hooks-config` prints or writes these; `devgate install-host` (the Kubernetes
//! installer's entrypoint) lays them, the binary and a default config onto a host root
//! (both commands in `host.rs`). A leaf: the commands import it, never the other way.

use crate::error::{Error, Result};
use crate::fsutil::{program, write_atomic};
use oci_spec::runtime::{Hook, HookBuilder};
use serde::Serialize;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// The PATH a runtime gives devgate; fixed, so a runtime's own environment cannot choose
/// what devgate (root) executes.
pub const HOOK_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Seconds before the runtime kills the hook. devgate's own deadlines at their defaults
/// (NVML and the kernel log 2 s each, the lease lock 3 s, the /dev edit 3 s) add up to 10 s
/// in the worst case; the margin keeps a slow node from turning devgate's clear reject
/// line into a bare "hook timed out".
pub const HOOK_TIMEOUT_S: i64 = 30;
/// The stages devgate is installed for.
pub const STAGES: [&str; 2] = ["prestart", "poststop"];
/// The default config packages and installers lay down (never over an existing one).
pub const DEFAULT_CONFIG: &str = include_str!("../../packaging/config.json");
/// The default spec `ctr oci spec` prints for containerd 1.6; the base of the shipped
/// base runtime spec.
const CONTAINERD_DEFAULT_SPEC: &str =
    include_str!("../../hooks/containerd/default-spec-containerd-1.6.json");
/// Where the shipped containerd snippet expects the base runtime spec.
pub const CONTAINERD_BASE_SPEC_NAME: &str = "devgate-base-spec.json";
/// A hooks directory CRI-O and podman read only where `hooks_dir` names it; install-host
/// wrote here once, and refreshes a devgate.json it finds there.
pub const HOST_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
/// Where packages and install-host put oci-hooks files: containers/common's
/// DefaultHooksDirs, what podman and CRI-O read when `hooks_dir` is not set.
pub const PACKAGE_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Crio,
    Podman,
    Containerd,
}

impl Runtime {
    pub fn parse(s: &str) -> Result<Runtime> {
        match s {
            "crio" | "cri-o" => Ok(Runtime::Crio),
            "podman" => Ok(Runtime::Podman),
            "containerd" => Ok(Runtime::Containerd),
            _ => Err(Error::Usage(format!(
                "unknown runtime {s:?}; expected crio, podman or containerd"
            ))),
        }
    }
}

/// What the runtime runs: the devgate binary, the program the hooks run, and the config
/// they name (none: devgate's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub bin: PathBuf,
    /// The hook front beside `bin` ([`program::HOOK_FRONT`]); `bin` itself where `--bin`
    /// names a devgate with no front beside it on this machine.
    pub hook: PathBuf,
    pub config: Option<PathBuf>,
}

impl Target {
    /// `PREFIX/bin/devgate`, its hooks `PREFIX/bin/devgate-hook`: what the packages,
    /// `make install` and `install-host` lay out.
    pub fn for_prefix(prefix: &Path) -> Result<Target> {
        absolute("--prefix", prefix)?;
        let bin = prefix.join("bin/devgate");
        Ok(Target {
            hook: bin.with_file_name(program::HOOK_FRONT),
            bin,
            config: None,
        })
    }

    /// `--bin PATH`: a devgate on this machine. Its hooks run the front beside it where there
    /// is one, else PATH itself: a hook file naming a program that is not there (a dangling
    /// link included) fails every start under runc, and podman and CRI-O skip it and start
    /// the container ungated.
    pub fn for_bin(bin: &Path) -> Target {
        let front = bin.with_file_name(program::HOOK_FRONT);
        let hook = if fs::metadata(&front).is_ok() {
            front
        } else {
            bin.to_path_buf()
        };
        Target {
            bin: bin.to_path_buf(),
            hook,
            config: None,
        }
    }
}

pub(super) fn absolute(what: &str, p: &Path) -> Result<()> {
    if p.is_absolute() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "{what} {} is not an absolute path",
            p.display()
        )))
    }
}

/// The hook entry for one stage.
pub fn hook(target: &Target, stage: &str) -> Result<Hook> {
    let mut args = vec!["devgate".to_string()];
    if let Some(c) = &target.config {
        args.push("--config".into());
        args.push(c.display().to_string());
    }
    args.extend(["hook".to_string(), stage.to_string()]);
    HookBuilder::default()
        .path(target.hook.clone())
        .args(args)
        .env(vec![HOOK_PATH_ENV.to_string()])
        .timeout(HOOK_TIMEOUT_S)
        .build()
        .map_err(|e| Error::invalid("hook", e.to_string()))
}

#[derive(Serialize)]
struct OciHooksFile {
    version: &'static str,
    hook: Hook,
    when: When,
    stages: [&'static str; 2],
}

#[derive(Serialize)]
struct When {
    always: bool,
}

/// A generated file: its name in its directory, and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub name: String,
    pub content: String,
}

pub const OCI_HOOKS_FILE_NAME: &str = "devgate.json";

/// The oci-hooks(5) file: prestart and poststop, matching every container.
pub fn oci_hooks_file(target: &Target) -> Result<File> {
    let f = OciHooksFile {
        version: "1.0.0",
        hook: hook(target, "auto")?,
        when: When { always: true },
        stages: STAGES,
    };
    Ok(File {
        name: OCI_HOOKS_FILE_NAME.into(),
        content: pretty(&f),
    })
}

/// Settings containerd's CRI clears on the spec it generates and keeps from a base spec,
/// so that every container on the node would get them: (object, key).
pub const NODE_WIDE_SETTINGS: [(&str, &str); 3] = [
    ("process", "rlimits"),
    ("process", "apparmorProfile"),
    ("linux", "seccomp"),
];

/// containerd's default spec without [`NODE_WIDE_SETTINGS`] (its RLIMIT_NOFILE 1024:1024
/// would cap every container), with devgate's prestart and poststop hooks.
pub fn containerd_base_spec(target: &Target) -> Result<File> {
    let mut spec: Value = serde_json::from_str(CONTAINERD_DEFAULT_SPEC)
        .map_err(|e| Error::json("built-in containerd default spec", None, &e))?;
    for (object, key) in NODE_WIDE_SETTINGS {
        if let Some(o) = spec.get_mut(object).and_then(Value::as_object_mut) {
            o.remove(key);
        }
    }
    let mut hooks = serde_json::Map::new();
    for stage in STAGES {
        let h = serde_json::to_value(hook(target, stage)?)
            .map_err(|e| Error::invalid("hook", e.to_string()))?;
        hooks.insert(stage.to_string(), Value::Array(vec![h]));
    }
    spec.as_object_mut()
        .ok_or_else(|| Error::invalid("built-in containerd default spec", "not an object"))?
        .insert("hooks".into(), Value::Object(hooks));
    Ok(File {
        name: CONTAINERD_BASE_SPEC_NAME.into(),
        content: pretty(&spec),
    })
}

fn pretty(v: &impl Serialize) -> String {
    // Serializing plain data to a String cannot fail.
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Every file a runtime needs.
pub fn files(runtime: Runtime, target: &Target) -> Result<Vec<File>> {
    match runtime {
        Runtime::Crio | Runtime::Podman => Ok(vec![oci_hooks_file(target)?]),
        Runtime::Containerd => Ok(vec![containerd_base_spec(target)?]),
    }
}

/// Writes each file into `dir` atomically, mode 0644 (runtimes read them as root, but
/// operators read them too).
pub fn write_files(dir: &Path, files: &[File]) -> Result<Vec<PathBuf>> {
    ensure_dir(dir)?;
    let mut out = Vec::new();
    for f in files {
        let p = dir.join(&f.name);
        write_atomic(&p, f.content.as_bytes(), 0o644)?;
        out.push(p);
    }
    Ok(out)
}

pub(super) fn ensure_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .create(dir)
        .map_err(|e| Error::io("cannot create directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn usr() -> Target {
        Target::for_prefix(Path::new("/usr")).unwrap()
    }

    #[test]
    fn oci_hooks_file_follows_oci_hooks_5() {
        let f = oci_hooks_file(&usr()).unwrap();
        assert_eq!(f.name, "devgate.json");
        let v: Value = serde_json::from_str(&f.content).unwrap();
        assert_eq!(v["version"], "1.0.0");
        assert_eq!(v["hook"]["path"], "/usr/bin/devgate-hook");
        assert_eq!(
            v["hook"]["args"],
            serde_json::json!(["devgate", "hook", "auto"])
        );
        assert_eq!(v["hook"]["env"], serde_json::json!([HOOK_PATH_ENV]));
        assert_eq!(v["hook"]["timeout"], HOOK_TIMEOUT_S);
        assert_eq!(v["when"], serde_json::json!({"always": true}));
        assert_eq!(v["stages"], serde_json::json!(["prestart", "poststop"]));
    }

    #[test]
    fn config_and_prefix_reach_the_hook() {
        let t = Target {
            config: Some("/opt/dg/etc/config.json".into()),
            ..Target::for_prefix(Path::new("/opt/dg")).unwrap()
        };
        let h = serde_json::to_value(hook(&t, "poststop").unwrap()).unwrap();
        assert_eq!(h["path"], "/opt/dg/bin/devgate-hook");
        assert_eq!(
            h["args"],
            serde_json::json!([
                "devgate",
                "--config",
                "/opt/dg/etc/config.json",
                "hook",
                "poststop"
            ])
        );
        assert!(Target::for_prefix(Path::new("usr/local")).is_err());
    }

    #[test]
    fn containerd_base_spec_is_the_default_spec_plus_hooks() {
        let f = containerd_base_spec(&usr()).unwrap();
        let v: Value = serde_json::from_str(&f.content).unwrap();
        let default: Value = serde_json::from_str(CONTAINERD_DEFAULT_SPEC).unwrap();
        for key in ["root", "mounts", "linux"] {
            assert_eq!(v[key], default[key], "{key}");
        }
        let mut process = default["process"].clone();
        process.as_object_mut().unwrap().remove("rlimits");
        assert_eq!(v["process"], process);
        for stage in STAGES {
            let hooks = v["hooks"][stage].as_array().unwrap();
            assert_eq!(hooks.len(), 1);
            assert_eq!(hooks[0]["path"], "/usr/bin/devgate-hook");
            assert_eq!(hooks[0]["args"][2], stage);
        }
        // oci-spec accepts what containerd will be given.
        let _: oci_spec::runtime::Spec = serde_json::from_str(&f.content).unwrap();
    }

    /// With a base spec, containerd's CRI skips its own defaults for these (it clears them on
    /// a generated spec): any left in the file reach every container on the node, such as
    /// containerd 1.6's RLIMIT_NOFILE 1024:1024.
    #[test]
    fn containerd_base_spec_sets_nothing_node_wide() {
        let f = containerd_base_spec(&usr()).unwrap();
        let v: Value = serde_json::from_str(&f.content).unwrap();
        assert_eq!(v["process"].get("rlimits"), None, "{}", f.content);
        assert_eq!(v["process"].get("apparmorProfile"), None);
        assert_eq!(v["linux"].get("seccomp"), None);
        assert!(!f.content.contains("RLIMIT_"), "{}", f.content);
    }

    /// The files shipped under hooks/ are exactly what `hooks-config --prefix /usr` prints:
    /// packages install them, so they must never drift from the generator.
    #[test]
    fn shipped_files_match_the_generator() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks");
        for f in files(Runtime::Podman, &usr()).unwrap() {
            let shipped = fs::read_to_string(root.join("oci-hooks.d").join(&f.name)).unwrap();
            assert_eq!(shipped, f.content, "hooks/oci-hooks.d/{}", f.name);
        }
        let f = containerd_base_spec(&usr()).unwrap();
        let shipped = fs::read_to_string(root.join("containerd").join(&f.name)).unwrap();
        assert_eq!(shipped, f.content, "hooks/containerd/{}", f.name);
    }

    #[test]
    fn default_config_parses() {
        let c = Config::parse(
            DEFAULT_CONFIG.as_bytes(),
            Path::new("/etc/devgate/config.json"),
        )
        .unwrap();
        assert_eq!(c.quarantine_dir, Path::new("/var/lib/devgate/quarantine"));
        assert!(c.log_file.is_some());
    }

    #[test]
    fn a_bin_without_a_front_beside_it_is_what_the_hooks_run() {
        let dir = crate::fsutil::tests::tempdir("hc-front");
        let bin = dir.join("devgate");
        fs::write(&bin, "").unwrap();
        // A devgate copied alone: hooks naming a front that is not there would fail every
        // start under runc, and be skipped (the container ungated) by podman and CRI-O.
        assert_eq!(Target::for_bin(&bin).hook, bin);
        fs::write(dir.join("devgate-hook"), "").unwrap();
        assert_eq!(Target::for_bin(&bin).hook, dir.join("devgate-hook"));
        // An install prefix is laid out by the packages and installers: always the front.
        assert_eq!(usr().hook, Path::new("/usr/bin/devgate-hook"));
    }

    /// A `devgate-hook` link whose target is gone is no front either: podman (4.3.1 here)
    /// and CRI-O stat a hook's program when they read hooks.d and skip a hook whose
    /// program is missing, running the container without it (where runc would fail it),
    /// so hooks naming the dangling link would gate nothing, without a word.
    #[test]
    fn a_dangling_front_link_is_no_front() {
        let dir = crate::fsutil::tests::tempdir("hc-dangling-front");
        let bin = dir.join("devgate");
        fs::write(&bin, "").unwrap();
        std::os::unix::fs::symlink("/nonexistent/devgate-hook", dir.join("devgate-hook")).unwrap();
        assert_eq!(Target::for_bin(&bin).hook, bin);
    }

    #[test]
    fn write_files_is_atomic_and_replaces() {
        let dir = std::env::temp_dir().join(format!("dg-hc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let fs1 = files(Runtime::Crio, &usr()).unwrap();
        write_files(&dir, &fs1).unwrap();
        let t = Target::for_prefix(Path::new("/opt")).unwrap();
        let fs2 = files(Runtime::Crio, &t).unwrap();
        let written = write_files(&dir, &fs2).unwrap();
        assert_eq!(written.len(), 1);
        for f in &fs2 {
            assert_eq!(fs::read_to_string(dir.join(&f.name)).unwrap(), f.content);
        }
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["devgate.json"], "no temp files left");
        fs::remove_dir_all(&dir).unwrap();
    }
}
