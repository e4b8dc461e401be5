//! What a runtime's configured binary (containerd's BinaryName, CRI-O's runtime_path) is:
//! devgate's runtime wrapper, devgate under a name that does not make it the wrapper,
//! NVIDIA's runtime and the runtime that one would run, or another runtime. Identity says
//! which files are devgate.

use super::files::{read_small, toml_error, which};
use crate::cli::doctor::error::ConfigError;
use crate::fsutil::program;
use crate::wrapper::PROGRAM;
use serde::Deserialize;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A runtime wrapper script that names devgate is small; larger files are binaries.
const MAX_WRAPPER_SCRIPT: u64 = 64 << 10;

/// NVIDIA's runtime, and where it lists the runtimes it runs.
pub(crate) const NVIDIA_RUNTIME: &str = "nvidia-container-runtime";
pub(crate) const NVIDIA_RUNTIME_CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";

/// The files that are devgate: this binary and the usual install paths (the packages' and
/// install-host's), and any the operator names. Compared by device and inode, so a symlink
/// or a hard link to devgate counts and a different file with the same name does not. The
/// hook front beside each of them counts for the hooks only.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) this: PathBuf,
    paths: Vec<PathBuf>,
    files: Vec<(u64, u64)>,
    /// The hook fronts beside them: devgate for the hooks, never a runtime wrapper.
    fronts: Vec<(u64, u64)>,
    /// The static runtime wrappers beside them (src/runtime_main.rs, what install-host and
    /// the packages lay out): the wrapper, handing device creates to that devgate.
    wrappers: Vec<(u64, u64)>,
}

impl Identity {
    pub(crate) fn new(extra: Option<&Path>) -> Identity {
        let this = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        let mut paths = vec![this.clone()];
        if let Some(p) = extra {
            paths.push(p.to_path_buf());
        }
        paths.push("/usr/bin/devgate".into());
        paths.push("/usr/local/bin/devgate".into());
        // The hook front beside each devgate (what the shipped hook files run) is devgate too,
        // where root alone could have written it and the devgate it hands GPU containers to:
        // one another user could replace runs their program as root on every container
        // start, and one whose devgate is missing or unsafe fails every GPU container.
        let beside = |name: &str| -> Vec<(u64, u64)> {
            paths
                .iter()
                .filter(|p| trusted_program(p))
                .map(|p| p.with_file_name(name))
                .filter(|p| trusted_program(p))
                .filter_map(|p| file_id(&p))
                .collect()
        };
        let fronts = beside(program::HOOK_FRONT);
        let files: Vec<(u64, u64)> = paths.iter().filter_map(|p| file_id(p)).collect();
        // A `devgate-runtime` that is devgate or its front is judged as such below.
        let wrappers = beside(PROGRAM)
            .into_iter()
            .filter(|id| !fronts.contains(id) && !files.contains(id))
            .collect();
        Identity {
            this,
            paths,
            files,
            fronts,
            wrappers,
        }
    }

    /// The hook at `path` is devgate: devgate itself or its hook front.
    pub(crate) fn is_devgate(&self, path: &Path) -> bool {
        file_id(path).is_some_and(|id| self.files.contains(&id) || self.fronts.contains(&id))
    }

    /// The runtime at `path` is devgate itself, not its hook front: the front hands any
    /// command line but `hook STAGE` to devgate as devgate's own (argv[0] `devgate`), so it
    /// is never the wrapper, whatever its name.
    fn is_devgate_binary(&self, path: &Path) -> bool {
        file_id(path).is_some_and(|id| self.files.contains(&id))
    }

    /// `path` is devgate's runtime wrapper: devgate under the name `devgate-runtime` (the
    /// runtime execs the configured path, and devgate acts as the wrapper only when its
    /// argv[0] has that name), or a small script that runs devgate as `devgate runtime` or
    /// through a `devgate-runtime` link to it.
    pub(crate) fn is_wrapper(&self, path: &Path) -> bool {
        if self.is_devgate_binary(path) {
            return path.file_name().is_some_and(|n| n == PROGRAM);
        }
        if file_id(path).is_some_and(|id| self.wrappers.contains(&id)) {
            return true;
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
            && self
                .paths
                .iter()
                .filter(|p| self.is_devgate_binary(p))
                .any(|p| {
                    let bin = p.to_string_lossy();
                    let link = p.with_file_name(PROGRAM);
                    ["", "\"", "'"]
                        .iter()
                        .any(|q| text.contains(&format!("{bin}{q} runtime")))
                        || (self.is_devgate_binary(&link)
                            && text.contains(&*link.to_string_lossy()))
                })
    }
}

/// What the hook front and the devgate beside it must be for the front to count as
/// devgate: the rule the front holds that devgate to ([`program::check_program`]).
fn trusted_program(p: &Path) -> bool {
    program::check_program(p).is_ok()
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// What a runtime's binary (containerd's BinaryName, CRI-O's runtime_path) turns out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Binary {
    /// Unset: the shim's default, runc.
    Default,
    DevgateWrapper(PathBuf),
    /// devgate under another name than `devgate-runtime`: it would take the runtime's
    /// arguments for devgate's own command line and fail every container.
    DevgateMisnamed(PathBuf),
    /// NVIDIA's runtime, and the low-level runtime it would run (devgate's wrapper or not).
    Nvidia {
        path: PathBuf,
        runs: Result<PathBuf, ConfigError>,
        runs_devgate: bool,
    },
    Other(PathBuf),
}

/// The base name of NVIDIA's runtime (also as `nvidia-container-runtime.cdi` and the like).
pub(crate) fn is_nvidia_runtime(path: &Path) -> bool {
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
pub(crate) fn nvidia_runtime_candidates(text: Option<&str>) -> Result<Vec<String>, ConfigError> {
    let listed = match text {
        Some(t) => {
            toml::from_str::<NvidiaConfig>(t)
                .map_err(|e| toml_error(None, &e))?
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
pub(crate) fn classify_binary(name: &str, id: &Identity, nvidia_config: &Path) -> Binary {
    if name.is_empty() {
        return Binary::Default;
    }
    let path = which(name).unwrap_or_else(|| PathBuf::from(name));
    if id.is_wrapper(&path) {
        return Binary::DevgateWrapper(path);
    }
    if id.is_devgate_binary(&path) {
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
            .map_err(|e| e.in_file(nvidia_config))
            .and_then(|c| {
                c.iter()
                    .find_map(|r| which(r))
                    .ok_or(ConfigError::NoneInstalled(c))
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
    /// Whether the runtime that finally runs the container is crun, which discards a hook's
    /// output (directly, or behind NVIDIA's runtime).
    pub(crate) fn runs_crun(&self) -> bool {
        let is_crun = |p: &Path| p.file_name().is_some_and(|n| n == "crun");
        match self {
            Binary::Other(p) => is_crun(p),
            Binary::Nvidia { runs: Ok(r), .. } => is_crun(r),
            _ => false,
        }
    }

    pub(crate) fn runs_devgate(&self) -> bool {
        match self {
            Binary::DevgateWrapper(_) => true,
            Binary::Nvidia { runs_devgate, .. } => *runs_devgate,
            _ => false,
        }
    }

    pub(crate) fn describe(&self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The hook front beside devgate counts as devgate only when root alone could have
    /// written it, as the devgate the front runs must be: a hook file naming another user's
    /// (or a world-writable) `devgate-hook` runs that user's program as root on every
    /// container start, and doctor must not pass it as devgate's hook.
    #[test]
    fn a_hook_front_another_user_could_write_is_not_devgate() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::fsutil::tests::tempdir("doctor-front-trust");
        let bin = dir.join("devgate");
        fs::write(&bin, b"\x7fELF").unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        let front = dir.join(crate::fsutil::program::HOOK_FRONT);
        fs::write(&front, b"\x7fELF").unwrap();
        fs::set_permissions(&front, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Identity::new(Some(&bin)).is_devgate(&front));

        fs::set_permissions(&front, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            !Identity::new(Some(&bin)).is_devgate(&front),
            "a world-writable devgate-hook counted as devgate"
        );
        fs::set_permissions(&front, fs::Permissions::from_mode(0o755)).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&front, Some(65534), Some(65534)).unwrap();
            assert!(
                !Identity::new(Some(&bin)).is_devgate(&front),
                "another user's devgate-hook counted as devgate"
            );
        }
    }

    /// The front hands every GPU container to the devgate beside it and refuses one that is
    /// not there or that another user could have written: the start then fails. A front
    /// without such a devgate beside it is no working devgate hook, and doctor must not
    /// pass it as one.
    #[test]
    fn a_hook_front_without_a_usable_devgate_beside_it_is_not_devgate() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::fsutil::tests::tempdir("doctor-front-alone");
        let bin = dir.join("devgate");
        let front = dir.join(crate::fsutil::program::HOOK_FRONT);
        fs::write(&front, b"\x7fELF").unwrap();
        fs::set_permissions(&front, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            !Identity::new(Some(&bin)).is_devgate(&front),
            "a devgate-hook with no devgate beside it counted as devgate"
        );
        fs::write(&bin, b"\x7fELF").unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            !Identity::new(Some(&bin)).is_devgate(&front),
            "a devgate-hook beside a world-writable devgate counted as devgate"
        );
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Identity::new(Some(&bin)).is_devgate(&front));
    }

    /// The hook front is devgate for the hooks only: it runs `hook STAGE` and hands any
    /// other command line to devgate as devgate's own (argv[0] `devgate`), so a runtime
    /// binary that is the front, even named `devgate-runtime`, fails every container with
    /// "unknown option" and is no runtime wrapper.
    #[test]
    fn the_hook_front_is_no_runtime_wrapper() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = crate::fsutil::tests::tempdir("doctor-front-wrapper");
        let bin = dir.join("devgate");
        let front = dir.join(crate::fsutil::program::HOOK_FRONT);
        for p in [&bin, &front] {
            fs::write(p, b"\x7fELF").unwrap();
            fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let link = dir.join(PROGRAM);
        symlink(crate::fsutil::program::HOOK_FRONT, &link).unwrap();
        let script = dir.join("devgate-runc");
        fs::write(
            &script,
            format!("#!/bin/sh\nexec {} \"$@\"\n", link.display()),
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let id = Identity::new(Some(&bin));
        // It is devgate's hook program all the same.
        assert!(id.is_devgate(&front));
        let nv = dir.join("nvidia.toml");
        for p in [&link, &front, &script] {
            assert!(!id.is_wrapper(p), "{}", p.display());
            assert_eq!(
                classify_binary(p.to_str().unwrap(), &id, &nv),
                Binary::Other(p.clone())
            );
        }
    }

    /// install-host lays the static `devgate-runtime` (src/runtime_main.rs) beside devgate:
    /// a program of its own, not a link, that hands device creates to the devgate beside it.
    /// It is the wrapper where root alone could have written it and that devgate; the
    /// front under the wrapper's name stays no wrapper.
    #[test]
    fn the_static_wrapper_beside_devgate_is_the_wrapper() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::fsutil::tests::tempdir("doctor-static-wrapper");
        let bin = dir.join("devgate");
        let wrapper = dir.join(PROGRAM);
        for p in [&bin, &wrapper] {
            fs::write(p, format!("\x7fELF {}", p.display())).unwrap();
            fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let nv = dir.join("nvidia.toml");
        let id = Identity::new(Some(&bin));
        assert!(id.is_wrapper(&wrapper));
        assert_eq!(
            classify_binary(wrapper.to_str().unwrap(), &id, &nv),
            Binary::DevgateWrapper(wrapper.clone())
        );
        // Another user could replace it: not devgate's.
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!Identity::new(Some(&bin)).is_wrapper(&wrapper));
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
        // The devgate it hands to is not usable: no wrapper either.
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!Identity::new(Some(&bin)).is_wrapper(&wrapper));
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        // Under another name it is no program devgate ships.
        let elsewhere = dir.join("devgate-runc");
        fs::copy(&wrapper, &elsewhere).unwrap();
        assert!(!Identity::new(Some(&bin)).is_wrapper(&elsewhere));
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
}
