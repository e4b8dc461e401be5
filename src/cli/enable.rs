//! `install-host --enable`, `--restart` and their undoing in `uninstall-host`: containerd's
//! config.toml names devgate's base spec (marked lines, so removal gives the file back byte
//! for byte), and containerd restarts through the host's own systemd, since it reads both
//! files only at start. Every host file a step changes is kept first: a containerd that
//! does not come back gets them back as they were and is restarted again, so no step
//! leaves a node that cannot start containers.

use super::conffile::read_opt;
use super::containerd_config::{self, Edit};
use super::containerd_dropin;
use super::cri_plugins;
use super::doctor::error::ConfigError;
use super::doctor::runtimes::containerd::{containerd_dump_in, parse_containerd_dump};
use super::hooks_config::absolute;
use super::host_exec;
use super::host_opts::Opts;
use super::systemd;
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// containerd's config file on the host at `root`.
pub(super) fn config_file(root: &Path) -> PathBuf {
    root.join("etc/containerd/config.toml")
}

/// The permission bits of the file at `path`, or 0644 for one that is not there yet.
fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644)
}

/// One host file as it was before a step wrote it.
struct Kept {
    path: PathBuf,
    before: Option<Vec<u8>>,
    mode: u32,
}

/// The host files a step changes, each kept as it was, to be put back.
#[derive(Default)]
pub(super) struct Changes(Vec<Kept>);

impl Changes {
    /// Keeps `path` as it is now, before the step writes it.
    pub(super) fn keep(&mut self, path: &Path) -> Result<()> {
        if self.0.iter().any(|k| k.path == path) {
            return Ok(());
        }
        self.0.push(Kept {
            path: path.to_path_buf(),
            before: read_opt(path)?,
            mode: mode_of(path),
        });
        Ok(())
    }

    /// Whether any kept file now reads otherwise.
    pub(super) fn any_changed(&self) -> Result<bool> {
        for k in &self.0 {
            if read_opt(&k.path)? != k.before {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Every kept file back as it was.
    pub(super) fn put_back(&self) -> Result<()> {
        for k in &self.0 {
            match &k.before {
                Some(bytes) => write_atomic(&k.path, bytes, k.mode)?,
                None => match fs::remove_file(&k.path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(Error::io("cannot remove", &k.path, e))
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }

    /// Runs `restart` of `service`; where it fails, puts every kept file back, runs it
    /// again, and fails saying both (`back`: what is back as it was).
    pub(super) fn restart_or_put_back(
        &self,
        service: &str,
        back: &str,
        restart: impl Fn() -> Result<()>,
    ) -> Result<()> {
        let Err(e) = restart() else {
            return Ok(());
        };
        if let Err(pe) = self.put_back() {
            return Err(Error::invalid(
                "--restart",
                format!(
                    "{e}; putting the files back failed too ({pe}): {service} was not restarted again"
                ),
            ));
        }
        let again = match restart() {
            Ok(()) => format!("{service} runs as before"),
            Err(e2) => format!("{service} did not restart either: {e2}"),
        };
        Err(Error::invalid(
            "--restart",
            format!("{e}; {back}, and {again}"),
        ))
    }
}

/// Where containerd's packages and release tarballs put it.
const CONTAINERD_PROGRAMS: [&str; 3] = [
    "usr/bin/containerd",
    "usr/local/bin/containerd",
    "usr/sbin/containerd",
];

/// The host's containerd program, as the host names it.
pub(super) fn containerd_program(root: &Path) -> Option<PathBuf> {
    host_exec::program_under(root, &CONTAINERD_PROGRAMS)
}

fn has_containerd(root: &Path) -> bool {
    containerd_program(root).is_some()
}

/// What the host's containerd makes of its config, its `imports` included: its CRI
/// plugin's default runtime must start from `spec`. containerd 1.6 and 1.7 replace a whole
/// plugin section from an imported drop-in (nvidia-ctk's, a registry mirror's), and one
/// may set the default runtime, so the file's own text cannot say. A host without a
/// containerd program has nothing to ask.
fn check_effective(root: &Path, spec: &Path, wrapper: Option<&Path>) -> Result<()> {
    let Some(bin) = containerd_program(root) else {
        return Ok(());
    };
    let file = config_file(root);
    let bad = |why: String| Error::invalid(file.display().to_string(), why);
    let conf = Path::new("/etc/containerd/config.toml");
    let cri = containerd_dump_in(root, &bin, Some(conf))
        .and_then(|dump| parse_containerd_dump(&dump))
        .map_err(|e: ConfigError| bad(e.to_string()))?;
    if cri.disabled {
        say!("devgate: containerd's CRI plugin is disabled here: kubelet does not use it");
        return Ok(());
    }
    let name = &cri.default_runtime;
    let effective = cri
        .runtimes
        .get(name)
        .map(|r| r.base_runtime_spec.as_str())
        .unwrap_or("");
    let binary = cri.runtimes.get(name).map(|r| r.binary_name.as_str());
    match wrapper {
        Some(w) if Path::new(effective) == spec && binary != Some(&*w.to_string_lossy()) => {
            return Err(bad(format!(
                "containerd reads it (with its imports) as running {:?} for its default \
                 runtime {name:?}, not {}: an imported drop-in sets BinaryName; set it there \
                 by hand (docs/install.md)",
                binary.unwrap_or(""),
                w.display()
            )))
        }
        _ if Path::new(effective) == spec => return Ok(()),
        _ => {}
    }
    Err(bad(format!(
        "containerd reads it (with its imports) as starting its default runtime {name:?} \
         from {}, not {}: an imported drop-in may replace the CRI plugin's section or set \
         the default runtime; add base_runtime_spec and container_annotations where that \
         runtime's table is, by hand (docs/install.md)",
        if effective.is_empty() {
            "no base spec"
        } else {
            effective
        },
        spec.display()
    )))
}

fn text_of(file: &Path) -> Result<String> {
    let bytes = read_opt(file)?.unwrap_or_default();
    String::from_utf8(bytes).map_err(|_| Error::invalid(file.display().to_string(), "not UTF-8"))
}

/// Edits containerd's config on the host at `root`: devgate's lines in (`spec`, the base
/// spec as the host names it) or, with `None`, out. Keeps the file in `changes` first.
/// With `crun_wrapper`, a default runtime that runs crun runs that wrapper instead (its
/// BinaryName line set aside, [`containerd_config::wrap_crun`]).
pub(super) fn edit_config(
    root: &Path,
    spec: Option<&Path>,
    crun_wrapper: Option<&Path>,
    changes: &mut Changes,
) -> Result<()> {
    let file = config_file(root);
    if spec.is_none() && !fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()) {
        // Removal: only a file devgate could have written holds its lines.
        return Ok(());
    }
    if spec.is_some() && read_opt(&file)?.is_none() && !has_containerd(root) {
        // A CRI-O or podman node: they read the hooks directory, with nothing to enable.
        say!(
            "devgate: no containerd here ({} is not there): nothing to enable",
            file.display()
        );
        return Ok(());
    }
    let text = text_of(&file)?;
    let edit = edited(&text, spec, crun_wrapper)
        .map_err(|e| Error::invalid(file.display().to_string(), e.to_string()))?;
    // The files of this step alone, put back at once where containerd would not read the
    // edit: no restart should pick up lines that reach no runtime.
    let mut this = Changes::default();
    match (edit, spec) {
        (Edit::Unchanged, Some(_)) => {
            say!(
                "devgate: {} already names devgate's base spec",
                file.display()
            )
        }
        (Edit::Unchanged, None) => {}
        (Edit::Changed(new), _) => {
            changes.keep(&file)?;
            this.keep(&file)?;
            write_atomic(&file, new.as_bytes(), mode_of(&file))?;
            match spec {
                Some(_) => say!(
                    "devgate: {} names devgate's base spec now (lines marked \"{}\")",
                    file.display(),
                    containerd_config::MARK
                ),
                None => say!("devgate: removed devgate's lines from {}", file.display()),
            }
        }
    }
    let now = text_of(&file)?;
    let Some(spec) = spec else {
        if let Some(p) = containerd_dropin::present(root, &text) {
            changes.keep(&host_exec::under(root, &p))?;
            containerd_dropin::remove(root, &p)?;
        }
        return Ok(());
    };
    reach_default_runtime(root, &now, spec, crun_wrapper, changes, &mut this)?;
    Ok(())
}

/// After config.toml's edit: containerd's default runtime must start from `spec` as
/// containerd reads its config with its imports. Where config.toml's lines do not reach it
/// (an imported drop-in holds the CRI section: the GPU Operator's), devgate's own copy of
/// that drop-in is laid after it ([`containerd_dropin`]); where it is already there, it
/// follows the drop-in it copies. Where neither reaches it, `this` step's files are put back.
fn reach_default_runtime(
    root: &Path,
    now: &str,
    spec: &Path,
    crun_wrapper: Option<&Path>,
    changes: &mut Changes,
    this: &mut Changes,
) -> Result<()> {
    let drop_in = |changes: &mut Changes, this: &mut Changes| -> Result<bool> {
        let want = containerd_dropin::wanted(root, now, spec)?;
        let Some((p, body)) = want else {
            return Ok(false);
        };
        let path = host_exec::under(root, &p);
        changes.keep(&path)?;
        this.keep(&path)?;
        containerd_dropin::lay(root, &p, &body)?;
        Ok(true)
    };
    // The toolkit may have rewritten the drop-in since devgate copied it, or removed it
    // (its cleanup): a copy must never outlive what it copies, or containerd would go on
    // running the toolkit's runtime after it is gone.
    let had = containerd_dropin::present(root, now);
    if let Some(copy) = &had {
        if !drop_in(changes, this)? {
            let path = host_exec::under(root, copy);
            changes.keep(&path)?;
            this.keep(&path)?;
            containerd_dropin::remove(root, copy)?;
        }
    }
    let had = had.is_some() && containerd_dropin::present(root, now).is_some();
    if let Err(e) = check_effective(root, spec, crun_wrapper) {
        // An imported drop-in holds the CRI section: devgate's own copy of it, read after.
        if had || !drop_in(changes, this)? {
            this.put_back()?;
            return Err(e);
        }
        if let Err(e) = check_effective(root, spec, crun_wrapper) {
            this.put_back()?;
            return Err(e);
        }
    }
    Ok(())
}

/// containerd's config text edited: devgate's base spec named (and with `crun_wrapper`,
/// crun's BinaryName set aside for it), or with no `spec` devgate's lines out.
fn edited(
    text: &str,
    spec: Option<&Path>,
    crun_wrapper: Option<&Path>,
) -> std::result::Result<Edit, containerd_config::EditError> {
    let Some(spec) = spec else {
        return containerd_config::disable(text);
    };
    let e = containerd_config::enable(text, spec)?;
    let Some(w) = crun_wrapper else {
        return Ok(e);
    };
    let base = match &e {
        Edit::Changed(t) => t.as_str(),
        Edit::Unchanged => text,
    };
    Ok(match super::containerd_crun::wrap_crun(base, w)? {
        Edit::Changed(t) => Edit::Changed(t),
        Edit::Unchanged => e,
    })
}

/// The host root install-host and uninstall-host act on: `--root`, absolute. `usage` is
/// the command's synopsis, for the error.
pub(super) fn host_root<'a>(o: &'a Opts, usage: &str) -> Result<&'a Path> {
    let root = o
        .root
        .as_deref()
        .ok_or_else(|| Error::Usage(format!("--root is required; {usage}")))?;
    absolute("--root", root)?;
    Ok(root)
}

/// Where `--restart` is asked, fails on a host whose systemd cannot restart containerd,
/// before anything on it changes.
pub(super) fn check_restart(o: &Opts, root: &Path) -> Result<()> {
    if o.restart {
        systemd::check(root)?;
    }
    Ok(())
}

/// Restarts containerd on the host at `root` through its systemd; fails where it does not
/// come back active, or comes back without its CRI plugin.
fn restart_checked(root: &Path) -> Result<()> {
    let unit = systemd::CONTAINERD_UNIT;
    systemd::restart(root, unit)?;
    cri_plugins::check(root, containerd_program(root).as_deref(), unit)
}

/// Restarts containerd on the host at `root` where `changes` changed a file, saying `now`
/// (what the restart turned devgate into) after it. Where it does not come back, puts the
/// files back, restarts it again, and fails saying both.
pub(super) fn restart(root: &Path, changes: &Changes, now: &str) -> Result<()> {
    if !changes.any_changed()? {
        say!("devgate: containerd needs no restart");
        return Ok(());
    }
    changes.restart_or_put_back(
        "containerd",
        "the files devgate changed are back as they were",
        || restart_checked(root),
    )?;
    say!("devgate: restarted {}; {now}", systemd::CONTAINERD_UNIT);
    Ok(())
}

/// Says what is left to do where `--restart` was not given and a file changed.
pub(super) fn say_restart_needed(changes: &Changes) -> Result<()> {
    if changes.any_changed()? {
        say!("devgate: containerd reads these files only at start: restart it (or rerun with --restart)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_back_restores_bytes_mode_and_absence() {
        let dir = crate::fsutil::tests::tempdir("enable-put-back");
        let a = dir.join("a");
        let b = dir.join("b");
        fs::write(&a, "before").unwrap();
        fs::set_permissions(&a, fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = Changes::default();
        c.keep(&a).unwrap();
        c.keep(&b).unwrap();
        assert!(!c.any_changed().unwrap());
        write_atomic(&a, b"after", 0o644).unwrap();
        fs::write(&b, "new").unwrap();
        assert!(c.any_changed().unwrap());
        c.put_back().unwrap();
        assert_eq!(fs::read_to_string(&a).unwrap(), "before");
        assert_eq!(
            fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!b.exists());
        assert!(!c.any_changed().unwrap());
    }

    /// attack35: the GPU Operator removed (its toolkit's cleanup deletes 99-nvidia.toml and
    /// its runtime under /usr/local/nvidia/toolkit, and restarts containerd) while devgate
    /// stays. docs/install.md's remedy is to rerun install-host --enable. But the copy is
    /// then `present`, `wanted` finds no CRI drop-in to copy, and containerd's dump (its
    /// default runtime `nvidia`, from the copy itself, starts from devgate's spec) passes
    /// `check_effective`: zz-devgate.toml stays, and keeps every pod start on the node on a
    /// runtime that is gone. The copy must not outlive the drop-in it copies.
    #[test]
    fn rerun_after_the_toolkit_is_removed_drops_the_stale_copy() {
        let root = crate::fsutil::tests::tempdir("enable-stale-dropin");
        let d = root.join("etc/containerd/conf.d");
        fs::create_dir_all(&d).unwrap();
        let nv = format!(
            "{}[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  \
             BinaryName = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\"\n",
            containerd_dropin::tests::TOOLKIT_DROPIN
        );
        fs::write(d.join("99-nvidia.toml"), nv).unwrap();
        let conf = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
        fs::write(config_file(&root), conf).unwrap();
        let spec = Path::new("/etc/containerd/devgate-base-spec.json");
        // install-host --enable on the toolkit's node: containerd's dump showed config.toml's
        // lines reaching no runtime, so the copy was laid (check_effective needs the host's
        // containerd, which this test has not: the step is taken as reach_default_runtime
        // takes it).
        let (file, body) = containerd_dropin::wanted(&root, conf, spec)
            .unwrap()
            .unwrap();
        containerd_dropin::lay(&root, &file, &body).unwrap();
        let copy = d.join(containerd_dropin::NAME);
        assert!(copy.is_file(), "the copy was not laid");
        // The operator's uninstall: the toolkit's cleanup removes its drop-in and runtime.
        fs::remove_file(d.join("99-nvidia.toml")).unwrap();
        // The documented remedy: install-host --enable again.
        edit_config(&root, Some(spec), None, &mut Changes::default()).unwrap();
        let left = fs::read_to_string(&copy).unwrap_or_default();
        assert!(
            !left.contains("default_runtime_name = \"nvidia\""),
            "install-host kept {} naming the removed toolkit's runtime as containerd's \
             default:\n{left}",
            copy.display()
        );
    }
}
