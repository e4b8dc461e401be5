//! devgate's own containerd drop-in, for a node where an imported drop-in (the GPU
//! Operator's: `nvidia-ctk runtime configure` writes `conf.d/99-nvidia.toml`) holds the CRI
//! plugin's section and sets the default runtime. devgate's lines in config.toml reach no
//! runtime there: containerd 1.6 and 1.7 take a whole plugin section from the last file
//! that has one, and the toolkit's copies runc's table (`base_runtime_spec = ""` included)
//! into its `nvidia` runtime, which 2.x merges over config.toml's too.
//!
//! So devgate copies that drop-in, adds its keys to the copy's default runtime as it does
//! to config.toml, and lays it beside it under a name read after it ([`NAME`]). The
//! toolkit's files are never written: uninstall-host removes devgate's file and nothing
//! else. The toolkit, rerun, copies what `containerd config dump` shows (devgate's keys
//! included) into its own drop-in; install-host, rerun, copies that again.

use super::conffile::read_opt;
use super::containerd_config::{self, parse, EditError};
use super::host_exec::under;
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use toml::{Table, Value};

/// devgate's drop-in's name: after every name that starts with a digit or a letter before
/// `z` (`99-nvidia.toml`), as containerd sorts an import glob's matches.
pub(super) const NAME: &str = "zz-devgate.toml";

/// The CRI plugin's section names, config versions 2 and 3.
const CRI: [&str; 2] = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"];

/// One import pattern of config.toml that containerd globs: `DIR/PREFIX*SUFFIX`, absolute,
/// with the wildcard in the file name only (what nvidia-ctk and the node images write).
struct Glob {
    dir: PathBuf,
    prefix: String,
    suffix: String,
}

impl Glob {
    fn of(pattern: &str) -> Option<Glob> {
        let p = Path::new(pattern);
        let dir = p.parent()?;
        let name = p.file_name()?.to_str()?;
        let (prefix, suffix) = name.split_once('*')?;
        let plain = |s: &str| !s.contains(['*', '?', '[']);
        (p.is_absolute() && plain(&dir.to_string_lossy()) && plain(suffix)).then(|| Glob {
            dir: dir.to_path_buf(),
            prefix: prefix.into(),
            suffix: suffix.into(),
        })
    }

    fn matches(&self, name: &str) -> bool {
        name.len() >= self.prefix.len() + self.suffix.len()
            && name.starts_with(&self.prefix)
            && name.ends_with(&self.suffix)
    }

    /// The files it matches under `root`, as containerd reads them (sorted), by host path.
    fn files(&self, root: &Path) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(under(root, &self.dir)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| self.matches(n) && !n.starts_with('.'))
            .collect();
        names.sort();
        names.into_iter().map(|n| self.dir.join(n)).collect()
    }
}

/// The imported file (host path) that containerd reads the CRI plugin's section from last,
/// with the glob it came through. devgate's own drop-in is not one.
fn last_cri_import(root: &Path, config_text: &str) -> Option<(PathBuf, Glob)> {
    let t = parse(config_text).ok()?;
    let imports = t.get("imports")?.as_array()?;
    let mut last = None;
    for pattern in imports.iter().filter_map(Value::as_str) {
        let Some(glob) = Glob::of(pattern) else {
            continue;
        };
        let mut found = None;
        for file in glob.files(root) {
            if file.file_name().is_some_and(|n| n == NAME) {
                continue;
            }
            let Ok(Some(bytes)) = read_opt(&under(root, &file)) else {
                continue;
            };
            let has_cri = parse(&String::from_utf8_lossy(&bytes))
                .ok()
                .and_then(|d| d.get("plugins")?.as_table().cloned())
                .is_some_and(|p| CRI.iter().any(|c| p.contains_key(*c)));
            if has_cri {
                found = Some(file);
            }
        }
        if let Some(f) = found {
            last = Some((f, glob));
        }
    }
    last
}

/// Whether the file at host path `file` under `root` is devgate's: its first line is
/// devgate's mark. A file of that name that is not devgate's is never written or removed.
pub(super) fn is_devgates(root: &Path, file: &Path) -> Result<bool> {
    let bytes = read_opt(&under(root, file))?.unwrap_or_default();
    Ok(bytes.starts_with(containerd_config::MARK.as_bytes()))
}

/// Fails, naming the file, where a file of devgate's name there is not devgate's.
fn refuse_foreign(root: &Path, file: &Path) -> Result<()> {
    let exists = fs::symlink_metadata(under(root, file)).is_ok();
    if exists && !is_devgates(root, file)? {
        return Err(Error::invalid(
            file.display().to_string(),
            "is not devgate's (no devgate mark on its first line): left as it is; move it \
             away to let install-host lay its drop-in there",
        ));
    }
    Ok(())
}

/// devgate's drop-in on the host at `root`, if one is there (its host path).
pub(super) fn present(root: &Path, config_text: &str) -> Option<PathBuf> {
    let t = parse(config_text).ok()?;
    let imports = t.get("imports")?.as_array()?;
    imports
        .iter()
        .filter_map(Value::as_str)
        .filter_map(Glob::of)
        .map(|g| g.dir.join(NAME))
        .find(|p| fs::symlink_metadata(under(root, p)).is_ok_and(|m| m.is_file()))
}

/// `text` (a drop-in's) with devgate's keys on its default runtime: `base_runtime_spec`
/// set to `spec`, devgate's annotation added to `container_annotations`. A structural
/// edit, as the file is devgate's own: the copy of a `config dump` already holds both keys
/// (empty), which a line added under the header would repeat.
fn with_keys(text: &str, spec: &Path) -> std::result::Result<String, EditError> {
    let mut t = parse(text)?;
    let v = containerd_config::version(&t)?;
    let path = containerd_config::runtime_path(&t, v)?;
    let no_table = || EditError::NoTable {
        table: path.join("."),
    };
    // Only runc's table may be made (containerd's implicit default); another runtime needs
    // its own runtime_type.
    let runc = path.last().is_some_and(|n| n == "runc");
    let mut rt: &mut Table = &mut t;
    for k in &path {
        if runc && !rt.contains_key(k) {
            rt.insert(k.clone(), Value::Table(Table::new()));
        }
        rt = rt
            .get_mut(k)
            .and_then(Value::as_table_mut)
            .ok_or_else(no_table)?;
    }
    if runc && !rt.contains_key("runtime_type") {
        rt.insert(
            "runtime_type".into(),
            Value::String("io.containerd.runc.v2".into()),
        );
    }
    let spec_s = spec.to_string_lossy().into_owned();
    match rt.get("base_runtime_spec") {
        Some(Value::String(s)) if !s.is_empty() && *s != spec_s => {
            return Err(EditError::OtherSpec {
                runtime: path.last().cloned().unwrap_or_default(),
                spec: s.clone(),
            })
        }
        Some(Value::String(_)) | None => {}
        Some(_) => {
            return Err(EditError::BadValue {
                key: format!("{}.base_runtime_spec", path.join(".")),
            })
        }
    }
    rt.insert("base_runtime_spec".into(), Value::String(spec_s));
    let list = rt
        .entry("container_annotations")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(list) = list else {
        return Err(EditError::BadValue {
            key: format!("{}.container_annotations", path.join(".")),
        });
    };
    let annotation = Value::String(containerd_config::ANNOTATION.into());
    if !list.contains(&annotation) {
        list.push(annotation);
    }
    toml::to_string(&t).map_err(|e| EditError::NotToml(e.to_string()))
}

/// What devgate's drop-in should read on the host at `root`: the last imported CRI
/// section's file with devgate's keys on its default runtime. Returns its host path and
/// text; `None` where no import holds the section, or where devgate's name would not be
/// read through the same glob.
pub(super) fn wanted(
    root: &Path,
    config_text: &str,
    spec: &Path,
) -> Result<Option<(PathBuf, String)>> {
    let Some((source, glob)) = last_cri_import(root, config_text) else {
        return Ok(None);
    };
    if !glob.matches(NAME) {
        return Ok(None);
    }
    let host = under(root, &source);
    let bytes = read_opt(&host)?.unwrap_or_default();
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::invalid(host.display().to_string(), "not UTF-8"))?;
    let body = with_keys(&text, spec)
        .map_err(|e| Error::invalid(source.display().to_string(), e.to_string()))?;
    let out = format!(
        "{mark}: {src} with devgate's base spec on its default runtime,\n\
         {mark}: read after it (containerd 1.x takes a whole plugin section from the last\n\
         {mark}: file that has one). uninstall-host removes this file; {src} is the toolkit's.\n{body}",
        mark = containerd_config::MARK,
        src = source.display(),
    );
    Ok(Some((glob.dir.join(NAME), out)))
}

/// Writes `text` to devgate's drop-in at host path `file` under `root` where it reads
/// otherwise; says so. Returns whether it wrote.
pub(super) fn lay(root: &Path, file: &Path, text: &str) -> Result<bool> {
    refuse_foreign(root, file)?;
    let path = under(root, file);
    if read_opt(&path)?.as_deref() == Some(text.as_bytes()) {
        return Ok(false);
    }
    write_atomic(&path, text.as_bytes(), 0o644)?;
    say!(
        "devgate: {} names devgate's base spec on the default runtime of the drop-in it copies",
        file.display()
    );
    Ok(true)
}

/// Removes devgate's drop-in at host path `file` under `root`.
pub(super) fn remove(root: &Path, file: &Path) -> Result<()> {
    refuse_foreign(root, file)?;
    let path = under(root, file);
    match fs::remove_file(&path) {
        Ok(()) => {
            say!("devgate: removed {}", file.display());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("cannot remove", &path, e)),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The toolkit's drop-in as nvidia-ctk copies a `config dump`: both of devgate's keys
    /// there, empty, on its default runtime `nvidia`.
    pub(in crate::cli) const TOOLKIT_DROPIN: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  base_runtime_spec = \"\"\n  container_annotations = []\n  runtime_type = \"io.containerd.runc.v2\"\n";

    #[test]
    fn globs_match_as_containerd_sorts_them() {
        let g = Glob::of("/etc/containerd/conf.d/*.toml").unwrap();
        assert!(g.matches(NAME));
        assert!(g.matches("99-nvidia.toml"));
        assert!(!g.matches("99-nvidia.conf"));
        // zz sorts after the toolkit's name.
        let mut names = [NAME, "99-nvidia.toml", "50-mirror.toml"];
        names.sort();
        assert_eq!(names.last(), Some(&NAME));
        assert!(Glob::of("conf.d/*.toml").is_none());
        assert!(Glob::of("/etc/*/x.toml").is_none());
        assert!(!Glob::of("/etc/containerd/conf.d/99-*.toml")
            .unwrap()
            .matches(NAME));
    }

    #[test]
    fn the_copy_is_the_last_cri_drop_in_with_devgates_keys() {
        let root = crate::fsutil::tests::tempdir("dropin-copy");
        let d = root.join("etc/containerd/conf.d");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("99-nvidia.toml"), TOOLKIT_DROPIN).unwrap();
        fs::write(d.join("10-other.toml"), "version = 2\n[plugins.x]\n").unwrap();
        let conf = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";
        let spec = Path::new("/etc/containerd/devgate-base-spec.json");
        let (file, text) = wanted(&root, conf, spec).unwrap().unwrap();
        assert_eq!(file, Path::new("/etc/containerd/conf.d").join(NAME));
        let t = parse(&text).unwrap();
        let p: Vec<String> = [CRI[0], "containerd", "runtimes", "nvidia"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut path = vec!["plugins".to_string()];
        path.extend(p);
        let rt = containerd_config::lookup(&t, &path).unwrap();
        assert_eq!(
            rt["base_runtime_spec"].as_str(),
            Some(spec.to_str().unwrap())
        );
        // devgate's own file is never the source, and is found where it is.
        fs::write(d.join(NAME), &text).unwrap();
        assert_eq!(present(&root, conf), Some(file));
        let (_, again) = wanted(&root, conf, spec).unwrap().unwrap();
        assert_eq!(again, text);
        // No import: nothing to copy.
        assert!(wanted(&root, "version = 2\n", spec).unwrap().is_none());
    }
}
