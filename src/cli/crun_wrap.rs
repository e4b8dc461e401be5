//! `install-host --enable` where crun runs: crun sends a hook's output to /dev/null, so
//! only devgate's runtime wrapper gets a reject line to the caller (docs/install.md).
//! For podman and CRI-O whose runtime is crun, a drop-in points that runtime's own name at
//! `devgate-runtime`, so containers made before and after keep the runtime they were made
//! with: podman's `[engine.runtimes] NAME` in containers.conf.d, CRI-O's handler
//! `runtime_path` in crio.conf.d. containerd's default runtime whose `BinaryName` is crun
//! is found here too; its edit is containerd_crun.rs's. The wrapper then runs
//! `runtime.path` of devgate's config, which must be crun. uninstall-host removes the
//! drop-ins (files of devgate's alone).
//!
//! Pure parts first (the drop-ins' text, the config's runtime.path), then the host's.

use super::conffile::read_opt;
use super::containerd_config::quoted;
use super::doctor::runtimes::containerd::{containerd_dump_in, parse_containerd_dump};
use super::doctor::runtimes::{crio, podman};
use super::enable::Changes;
use super::host_exec::{self, under};
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// podman's drop-in, on the host; sorted last of the usual names, so that it wins.
pub(super) const PODMAN_DROPIN: &str = "/etc/containers/containers.conf.d/99-devgate-runtime.conf";
/// CRI-O's drop-in, on the host.
pub(super) const CRIO_DROPIN: &str = "/etc/crio/crio.conf.d/99-devgate-runtime.conf";
/// What starts every drop-in devgate writes: uninstall-host removes only such a file.
const HEAD: &str = "# devgate install-host:";
/// The runtime the wrapper runs where install-host puts it in front of crun.
const CRUN: &str = "crun";

/// podman's drop-in: the runtime `name` (crun) resolves to the wrapper.
pub(super) fn podman_dropin(name: &str, wrapper: &Path) -> String {
    format!(
        "{HEAD} podman runs its runtime {} through devgate's runtime\n\
         # wrapper, which runs crun (runtime.path in devgate's config); uninstall-host removes\n\
         # this file (docs/install.md).\n\
         [engine.runtimes]\n\
         {} = [{}]\n",
        quoted(name),
        quoted(name),
        quoted(&wrapper.to_string_lossy())
    )
}

/// CRI-O's drop-in: the handler `name` (crun) runs the wrapper, with crun's state root.
pub(super) fn crio_dropin(name: &str, wrapper: &Path) -> String {
    format!(
        "{HEAD} CRI-O runs its runtime handler {} through devgate's\n\
         # runtime wrapper, which runs crun (runtime.path in devgate's config); uninstall-host\n\
         # removes this file (docs/install.md). Restart CRI-O after a change.\n\
         [crio.runtime.runtimes.{}]\n\
         runtime_path = {}\n\
         runtime_type = \"oci\"\n\
         runtime_root = \"/run/crun\"\n",
        quoted(name),
        quoted(name),
        quoted(&wrapper.to_string_lossy())
    )
}

/// What devgate's config says of the runtime its wrapper runs.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ConfigRuntime {
    /// The config already names crun.
    Crun,
    /// The config names no runtime: its new text, naming crun.
    Add(Vec<u8>),
    /// The config names another runtime.
    Other(String),
}

/// What devgate's config (`text`, JSON) says of `runtime.path`, and where it names none,
/// the text with `"runtime": {"path": crun}` as its first key, nothing else changed.
pub(super) fn config_runtime(text: &[u8], crun: &str) -> Result<ConfigRuntime> {
    let bad = |why: &str| Error::invalid("config", why.to_string());
    let v: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
    if let Some(rt) = obj.get("runtime") {
        let path = rt.get("path").and_then(|p| p.as_str()).unwrap_or("runc");
        return Ok(if Path::new(path).file_name().is_some_and(|n| n == CRUN) {
            ConfigRuntime::Crun
        } else {
            ConfigRuntime::Other(path.to_string())
        });
    }
    let at = text
        .iter()
        .position(|b| *b == b'{')
        .ok_or_else(|| bad("not a JSON object"))?;
    let sep = if obj.is_empty() { "" } else { "," };
    let mut out = text[..=at].to_vec();
    let path = serde_json::Value::from(crun).to_string();
    out.extend_from_slice(format!("\"runtime\": {{\"path\": {path}}}{sep}").as_bytes());
    out.extend_from_slice(&text[at + 1..]);
    // Checked: the same object plus the one key.
    let mut want = obj.clone();
    want.insert("runtime".into(), serde_json::json!({ "path": crun }));
    match serde_json::from_slice::<serde_json::Value>(&out) {
        Ok(serde_json::Value::Object(got)) if got == want => Ok(ConfigRuntime::Add(out)),
        _ => Err(bad("runtime.path could not be added")),
    }
}

// ---------------------------------------------------------------------------------------
// The host.

/// The runtimes on the host at `root` that run crun with hooks alone, by manager.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct CrunRuntimes {
    /// podman's runtime name.
    pub podman: Option<String>,
    /// CRI-O's default runtime handler.
    pub crio: Option<String>,
    /// containerd's CRI default runtime.
    pub containerd: Option<String>,
    /// The crun programs CRI-O and containerd name by an absolute path, as the host names
    /// them (CRI-O's packages run /usr/libexec/crio/crun).
    pub crun_paths: Vec<PathBuf>,
}

impl CrunRuntimes {
    pub(super) fn any(&self) -> bool {
        self.podman.is_some() || self.crio.is_some() || self.containerd.is_some()
    }
}

/// containerd's CRI default runtime where it runs crun, as containerd reads its config
/// (imports included), or where devgate already set its crun aside (a rerun). A dump that
/// fails names nothing here: the base spec's edit checks the dump and says why.
/// Its absolute crun path goes to `paths`.
fn containerd_crun(root: &Path, paths: &mut Vec<PathBuf>) -> Result<Option<String>> {
    let Some(bin) = super::enable::containerd_program(root) else {
        return Ok(None);
    };
    let file = super::enable::config_file(root);
    let text = read_opt(&file)?.unwrap_or_default();
    let set_aside = String::from_utf8_lossy(&text)
        .lines()
        .any(|l| l.starts_with(super::containerd_config::WAS));
    let conf = Path::new("/etc/containerd/config.toml");
    let named = fs::symlink_metadata(&file).is_ok().then_some(conf);
    let Ok(cri) = containerd_dump_in(root, &bin, named).and_then(|d| parse_containerd_dump(&d))
    else {
        return Ok(None);
    };
    let name = cri.default_runtime.clone();
    let crun = cri.runtimes.get(&name).is_some_and(|r| {
        Path::new(&r.binary_name)
            .file_name()
            .is_some_and(|n| n == CRUN)
    });
    if let Some(r) = cri.runtimes.get(&name).filter(|_| crun) {
        paths.push(PathBuf::from(&r.binary_name));
    }
    Ok((!cri.disabled && (crun || set_aside)).then_some(name))
}

/// What `runtime.path` names crun by for the wrapper on the host at `root`: `crun` where
/// the wrapper finds it in its own directories, else the first of the runtimes' own crun
/// paths that is there; None where crun is not installed for it to run.
pub(super) fn crun_for_wrapper(root: &Path, found: &CrunRuntimes) -> Option<String> {
    let is_file = |p: &Path| fs::metadata(under(root, p)).is_ok_and(|m| m.is_file());
    if crate::wrapper::runtime::SEARCH_DIRS
        .iter()
        .any(|d| is_file(&Path::new(d).join(CRUN)))
    {
        return Some(CRUN.into());
    }
    found
        .crun_paths
        .iter()
        .find(|p| p.is_absolute() && is_file(p))
        .map(|p| p.to_string_lossy().into_owned())
}

/// The files of a manager's configuration under `root` without devgate's own drop-in:
/// what the manager runs without devgate, so a rerun finds the same runtime.
fn without(files: Vec<(PathBuf, String)>, ours: &Path) -> Vec<(PathBuf, String)> {
    files.into_iter().filter(|(p, _)| p != ours).collect()
}

/// Which managers on the host at `root` run crun. A manager whose configuration does not
/// parse (it fails on it itself) is left as it is, and said so.
pub(super) fn find(root: &Path) -> Result<CrunRuntimes> {
    let mut found = CrunRuntimes::default();
    if host_exec::program_under(root, &["usr/bin/podman", "usr/local/bin/podman"]).is_some() {
        let confs = without(
            podman::containers_confs_under(root, None),
            &under(root, Path::new(PODMAN_DROPIN)),
        );
        match podman::podman_runtime(&confs) {
            Ok(podman::PodmanRuntime::Crun(name)) => found.podman = Some(name),
            Ok(_) => {}
            Err(e) => say!(
                "devgate: podman's containers.conf does not read ({e}): podman is left as it is"
            ),
        }
    }
    found.containerd = containerd_crun(root, &mut found.crun_paths)?;
    if host_exec::program_under(root, &["usr/bin/crio", "usr/local/bin/crio"]).is_some() {
        let main = under(root, Path::new("/etc/crio/crio.conf"));
        match crio::read_crio(&main)
            .map(|f| without(f, &under(root, Path::new(CRIO_DROPIN))))
            .and_then(|f| crio::parse_crio(&f))
        {
            Ok(c) => {
                let (name, path) = crio::default_runtime_binary(&c);
                if Path::new(&path).file_name().is_some_and(|n| n == CRUN) {
                    found.crio = Some(name);
                    found.crun_paths.push(path.into());
                }
            }
            Err(e) => say!("devgate: CRI-O's config does not read ({e}): CRI-O is left as it is"),
        }
    }
    Ok(found)
}

/// Writes one drop-in (`host` on the host) with `text`, kept in `changes` first, and checks
/// it with `check` (the manager's own reading of its files): where that fails the file goes
/// back at once and the install fails with why.
fn lay(
    root: &Path,
    host: &str,
    text: &str,
    changes: &mut Changes,
    check: impl Fn() -> std::result::Result<(), String>,
) -> Result<()> {
    let path = under(root, Path::new(host));
    if read_opt(&path)?.as_deref() == Some(text.as_bytes()) {
        say!("devgate: {} is in place", path.display());
        return Ok(());
    }
    if let Some(other) = read_opt(&path)? {
        if !other.starts_with(HEAD.as_bytes()) {
            return Err(Error::invalid(
                path.display().to_string(),
                "is not devgate's: move it aside, or put devgate-runtime in front of crun by hand \
                 (docs/install.md)",
            ));
        }
    }
    if let Some(dir) = path.parent() {
        super::hooks_config::ensure_dir(dir)?;
    }
    changes.keep(&path)?;
    let mut this = Changes::default();
    this.keep(&path)?;
    write_atomic(&path, text.as_bytes(), 0o644)?;
    if let Err(why) = check() {
        this.put_back()?;
        return Err(Error::invalid(path.display().to_string(), why));
    }
    say!(
        "devgate: {} runs crun through devgate-runtime",
        path.display()
    );
    Ok(())
}

/// The wrapper as the host runs it: `devgate-runtime --version` inside `root`, with no
/// DEVGATE_CONFIG (conmon and CRI-O pass none), must reach crun: devgate's config read,
/// runtime.path resolved and trusted, crun exec'd.
fn wrapper_reaches_crun(root: &Path, wrapper: &Path) -> std::result::Result<(), String> {
    let mut cmd = Command::new(wrapper);
    host_exec::run_inside(&mut cmd, root).map_err(|e| e.to_string())?;
    cmd.arg("--version")
        .env_remove("DEVGATE_CONFIG")
        .current_dir("/");
    let out = host_exec::output_within(cmd, Duration::from_secs(20), 64 << 10)
        .map_err(|e| format!("{} --version: {e}", wrapper.display()))?;
    let out = String::from_utf8_lossy(&out);
    match out.lines().next() {
        Some(l) if l.starts_with("crun version") => Ok(()),
        l => Err(format!(
            "{} --version printed {:?}, not crun's version",
            wrapper.display(),
            l.unwrap_or("")
        )),
    }
}

/// The drop-ins for the managers `found` names, each checked as its manager reads it;
/// CRI-O's is kept in `crio_changes` (CRI-O reads it at start; podman at each command).
pub(super) fn enable(
    root: &Path,
    wrapper: &Path,
    found: &CrunRuntimes,
    crio_changes: &mut Changes,
) -> Result<()> {
    if let Some(name) = &found.podman {
        let mut podman_changes = Changes::default();
        let changes = &mut podman_changes;
        lay(
            root,
            PODMAN_DROPIN,
            &podman_dropin(name, wrapper),
            changes,
            || match podman::podman_runtime(&podman::containers_confs_under(root, None)) {
                Ok(podman::PodmanRuntime::Wrapper(w)) if w == wrapper => {
                    wrapper_reaches_crun(root, wrapper)
                }
                Ok(other) => Err(format!(
                    "podman reads its runtime as {other:?} with it (a later drop-in sets \
                     [engine.runtimes]): add devgate-runtime there by hand (docs/install.md)"
                )),
                Err(e) => Err(e.to_string()),
            },
        )?;
    }
    if let Some(name) = &found.crio {
        lay(
            root,
            CRIO_DROPIN,
            &crio_dropin(name, wrapper),
            crio_changes,
            || {
                let main = under(root, Path::new("/etc/crio/crio.conf"));
                let c = crio::read_crio(&main)
                    .and_then(|f| crio::parse_crio(&f))
                    .map_err(|e| e.to_string())?;
                match crio::default_runtime_binary(&c) {
                    (_, p) if Path::new(&p) == wrapper => wrapper_reaches_crun(root, wrapper),
                    (n, p) => Err(format!(
                        "CRI-O reads its default runtime as {n:?} ({p}) with it (a later drop-in \
                     sets it): add devgate-runtime there by hand (docs/install.md)"
                    )),
                }
            },
        )?;
    }
    Ok(())
}

/// The drop-ins taken out again, where they are devgate's; CRI-O's kept in `crio_changes`
/// first (CRI-O reads it only at start).
pub(super) fn disable(root: &Path, crio_changes: &mut Changes) -> Result<()> {
    for host in [PODMAN_DROPIN, CRIO_DROPIN] {
        let path = under(root, Path::new(host));
        match read_opt(&path)? {
            Some(t) if t.starts_with(HEAD.as_bytes()) => {
                if host == CRIO_DROPIN {
                    crio_changes.keep(&path)?;
                }
                fs::remove_file(&path).map_err(|e| Error::io("cannot remove", &path, e))?;
                say!("devgate: removed {}", path.display());
                // The drop-in directory install-host may have made, where nothing else is in
                // it (a manager reads none the same as an empty one).
                if let Some(dir) = path.parent() {
                    let _ = fs::remove_dir(dir);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// devgate's own drop-ins under `root`.
pub(super) fn dropins(root: &Path) -> Vec<PathBuf> {
    [PODMAN_DROPIN, CRIO_DROPIN]
        .iter()
        .map(|p| under(root, Path::new(p)))
        .collect()
}

/// CRI-O's unit: it reads its drop-ins only at start.
const CRIO_UNIT: &str = "crio.service";

/// Restarts CRI-O where `changes` changed its drop-in; where it does not come back, the
/// drop-in goes back as it was and CRI-O is restarted again, and this fails saying both.
pub(super) fn restart_crio(root: &Path, changes: &Changes) -> Result<()> {
    if !changes.any_changed()?
        || host_exec::program_under(root, &["usr/bin/crio", "usr/local/bin/crio"]).is_none()
    {
        return Ok(());
    }
    changes.restart_or_put_back("CRI-O", "CRI-O's drop-in is back as it was", || {
        super::systemd::restart(root, CRIO_UNIT)
    })?;
    say!("devgate: restarted {CRIO_UNIT}");
    Ok(())
}

/// Says that CRI-O must be restarted where its drop-in changed.
pub(super) fn say_restart_needed(changes: &Changes) -> Result<()> {
    if changes.any_changed()? {
        say!(
            "devgate: CRI-O reads its drop-ins only at start: restart it (or rerun with --restart)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: &str = "/usr/local/bin/devgate-runtime";

    #[test]
    fn config_gains_runtime_path_and_nothing_else() {
        let text = b"{\n  \"state_dir\": \"/run/devgate\"\n}\n";
        let ConfigRuntime::Add(new) = config_runtime(text, CRUN).unwrap() else {
            panic!("not added");
        };
        assert_eq!(
            String::from_utf8(new).unwrap(),
            "{\"runtime\": {\"path\": \"crun\"},\n  \"state_dir\": \"/run/devgate\"\n}\n"
        );
        let ConfigRuntime::Add(new) = config_runtime(b" {} ", CRUN).unwrap() else {
            panic!("not added");
        };
        assert_eq!(new, b" {\"runtime\": {\"path\": \"crun\"}} ");
        // The shipped default and the DaemonSet's ConfigMap parse with it as devgate's config.
        for text in [
            super::super::hooks_config::DEFAULT_CONFIG.as_bytes(),
            b"{\"policy\": {\"default\": \"reject\"}}",
        ] {
            let ConfigRuntime::Add(new) = config_runtime(text, CRUN).unwrap() else {
                panic!("not added");
            };
            let c = crate::config::Config::parse(&new, Path::new("/c.json")).unwrap();
            assert_eq!(c.runtime.path, Path::new("crun"));
        }
        assert_eq!(
            config_runtime(br#"{"runtime": {"path": "/usr/bin/crun"}}"#, CRUN).unwrap(),
            ConfigRuntime::Crun
        );
        assert_eq!(
            config_runtime(br#"{"runtime": {}}"#, CRUN).unwrap(),
            ConfigRuntime::Other("runc".into())
        );
        assert_eq!(
            config_runtime(
                br#"{"runtime": {"path": "nvidia-container-runtime"}}"#,
                CRUN
            )
            .unwrap(),
            ConfigRuntime::Other("nvidia-container-runtime".into())
        );
        // CRI-O's own crun, by its path.
        let ConfigRuntime::Add(new) = config_runtime(b"{}", "/usr/libexec/crio/crun").unwrap()
        else {
            panic!("not added");
        };
        assert_eq!(new, br#"{"runtime": {"path": "/usr/libexec/crio/crun"}}"#);
        for bad in [&b"[]"[..], b"{", b"\"x\""] {
            assert!(config_runtime(bad, CRUN).is_err(), "{bad:?}");
        }
    }

    /// podman's drop-in read as podman reads it (after the files before it): the runtime's
    /// own name resolves to the wrapper; removed, crun again.
    #[test]
    fn podman_reads_the_drop_in_as_the_wrapper() {
        let share = (
            PathBuf::from("/usr/share/containers/containers.conf"),
            "[engine]\nruntime = \"crun\"\n[engine.runtimes]\ncrun = [\"/usr/bin/crun\", \"/usr/sbin/crun\"]\nrunc = [\"/usr/bin/runc\"]\n".to_string(),
        );
        let before = podman::podman_runtime(std::slice::from_ref(&share)).unwrap();
        assert_eq!(before, podman::PodmanRuntime::Crun("crun".into()));
        let ours = (
            PathBuf::from(PODMAN_DROPIN),
            podman_dropin("crun", Path::new(W)),
        );
        let after = podman::podman_runtime(&[share, ours]).unwrap();
        assert_eq!(after, podman::PodmanRuntime::Wrapper(W.into()));
        // An odd runtime name stays one TOML key.
        let odd = podman_dropin("cr\"un\n", Path::new(W));
        let v: toml::Value = toml::from_str(&odd).unwrap();
        assert_eq!(v["engine"]["runtimes"]["cr\"un\n"][0].as_str(), Some(W));
    }

    /// CRI-O's drop-in, file level (CRI-O is packaged in neither test stack): after
    /// crio.conf its default handler runs the wrapper, with crun's state root.
    #[test]
    fn crio_reads_the_drop_in_as_the_wrapper() {
        let main = (
            PathBuf::from("/etc/crio/crio.conf"),
            "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/libexec/crio/crun\"\n".to_string(),
        );
        let c = crio::parse_crio(std::slice::from_ref(&main)).unwrap();
        assert_eq!(
            crio::default_runtime_binary(&c),
            ("crun".into(), "/usr/libexec/crio/crun".into())
        );
        let text = crio_dropin("crun", Path::new(W));
        let c = crio::parse_crio(&[main, (CRIO_DROPIN.into(), text.clone())]).unwrap();
        assert_eq!(crio::default_runtime_binary(&c), ("crun".into(), W.into()));
        let v: toml::Value = toml::from_str(&text).unwrap();
        let h = &v["crio"]["runtime"]["runtimes"]["crun"];
        assert_eq!(h["runtime_root"].as_str(), Some("/run/crun"));
        assert_eq!(h["runtime_type"].as_str(), Some("oci"));
        assert!(text.starts_with(HEAD));
    }

    /// The drop-ins on a host root: laid, found again on a rerun (the runtime found without
    /// them), an operator's file of that name refused, and taken out byte for byte. Long
    /// because each step reads the same host root the one before left.
    #[test]
    fn drop_ins_on_a_host_root() {
        let root = crate::fsutil::tests::tempdir("crun-wrap-root");
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("usr/bin/podman"), "").unwrap();
        fs::write(root.join("usr/bin/crio"), "").unwrap();
        fs::create_dir_all(root.join("usr/share/containers")).unwrap();
        fs::write(
            root.join("usr/share/containers/containers.conf"),
            "[engine]\n",
        )
        .unwrap();
        let found = find(&root).unwrap();
        assert_eq!(found.podman.as_deref(), Some("crun"));
        assert_eq!(
            found.crio.as_deref(),
            Some("crun"),
            "CRI-O's default is crun"
        );
        let crio = under(&root, Path::new(CRIO_DROPIN));
        fs::create_dir_all(crio.parent().unwrap()).unwrap();
        fs::write(&crio, crio_dropin("crun", Path::new(W))).unwrap();
        assert_eq!(
            find(&root).unwrap(),
            found,
            "devgate's own drop-in is not read"
        );
        let mut changes = Changes::default();
        disable(&root, &mut changes).unwrap();
        assert!(!crio.exists());
        assert!(
            !crio.parent().unwrap().exists(),
            "its empty directory goes too"
        );
        assert!(changes.any_changed().unwrap());
        fs::create_dir_all(crio.parent().unwrap()).unwrap();
        fs::write(&crio, "[crio.runtime]\n").unwrap();
        let e = lay(&root, CRIO_DROPIN, "x", &mut Changes::default(), || Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not devgate's"), "{e}");
        disable(&root, &mut Changes::default()).unwrap();
        assert!(crio.exists(), "an operator's file stays");
        // A check that fails puts the file back as it was (here: absent).
        let podman = under(&root, Path::new(PODMAN_DROPIN));
        let e = lay(&root, PODMAN_DROPIN, HEAD, &mut Changes::default(), || {
            Err("no".into())
        })
        .unwrap_err()
        .to_string();
        assert!(e.ends_with("no"), "{e}");
        assert!(!podman.exists());
        // A link planted at the drop-in's name is not followed: nothing is written through it.
        fs::create_dir_all(podman.parent().unwrap()).unwrap();
        fs::write(root.join("elsewhere"), "theirs").unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), &podman).unwrap();
        assert!(
            lay(&root, PODMAN_DROPIN, HEAD, &mut Changes::default(), || Ok(
                ()
            ))
            .is_err()
        );
        assert!(disable(&root, &mut Changes::default()).is_err());
        assert_eq!(
            fs::read_to_string(root.join("elsewhere")).unwrap(),
            "theirs"
        );
        fs::remove_file(&podman).unwrap();
        // crun for the wrapper: none installed; CRI-O's own by its path; one in the
        // wrapper's directories by name.
        let mut found = found;
        assert_eq!(crun_for_wrapper(&root, &found), None);
        found.crun_paths = vec!["/usr/libexec/crio/crun".into()];
        fs::create_dir_all(root.join("usr/libexec/crio")).unwrap();
        fs::write(root.join("usr/libexec/crio/crun"), "").unwrap();
        assert_eq!(
            crun_for_wrapper(&root, &found).as_deref(),
            Some("/usr/libexec/crio/crun")
        );
        fs::write(root.join("usr/bin/crun"), "").unwrap();
        assert_eq!(crun_for_wrapper(&root, &found).as_deref(), Some(CRUN));
        // A containers.conf podman cannot read either: podman is left alone, not the install.
        fs::write(
            root.join("usr/share/containers/containers.conf"),
            "[engine\n",
        )
        .unwrap();
        assert_eq!(find(&root).unwrap().podman, None);
        fs::remove_dir_all(&root).unwrap();
    }
}
