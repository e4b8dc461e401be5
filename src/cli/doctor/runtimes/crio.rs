//! CRI-O's configuration: the hooks directories it reads, its cgroup manager, and the
//! runtime it runs by default.

use super::files::{read_small, toml_error, MAX_HOOK_FILES};
use crate::cli::doctor::error::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------
// CRI-O: crio.conf and its drop-ins, later files overriding the keys they set.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CrioConfig {
    pub(crate) hooks_dir: Option<Vec<PathBuf>>,
    pub(crate) cgroup_manager: Option<String>,
    pub(crate) default_runtime: Option<String>,
    pub(crate) runtime_paths: BTreeMap<String, String>,
}

/// CRI-O's own default hooks directory (containers/common's DefaultHooksDirs); unlike
/// podman, CRI-O does not add /etc/containers/oci/hooks.d unless hooks_dir names it.
pub(crate) const CRIO_DEFAULT_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

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

/// CRI-O's built-in default runtime since 1.31 (its packages set it since 1.28).
pub(crate) const CRIO_DEFAULT_RUNTIME: &str = "crun";

/// The default runtime's name and the binary CRI-O runs for it: its `runtime_path`, else
/// its name, which CRI-O looks up in PATH.
pub(crate) fn default_runtime_binary(c: &CrioConfig) -> (String, String) {
    let name = c
        .default_runtime
        .clone()
        .unwrap_or_else(|| CRIO_DEFAULT_RUNTIME.into());
    let path = c
        .runtime_paths
        .get(&name)
        .cloned()
        .unwrap_or_else(|| name.clone());
    (name, path)
}

/// Merges CRI-O's files in the order CRI-O reads them (crio.conf, then the drop-ins sorted).
pub(crate) fn parse_crio(files: &[(PathBuf, String)]) -> Result<CrioConfig, ConfigError> {
    let mut c = CrioConfig::default();
    for (path, text) in files {
        let f: CrioFile = toml::from_str(text).map_err(|e| toml_error(Some(path), &e))?;
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

/// crio.conf and the drop-ins beside it as CRI-O reads them: its filepath.Walk of
/// crio.conf.d takes every file, whatever its name, in the directories below too, in the
/// walk's order (by name, a directory's files where its name sorts). More than
/// [`MAX_HOOK_FILES`] entries is an error: a file left out could set what CRI-O runs.
pub(crate) fn read_crio(main: &Path) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    let mut files = Vec::new();
    if fs::symlink_metadata(main).is_ok() {
        files.push((main.to_path_buf(), read_small(main)?));
    }
    let dropins = main.with_extension("conf.d");
    let mut paths = Vec::new();
    let mut seen = 0;
    walk(&dropins, &dropins, &mut paths, &mut seen)?;
    // Path order is by component, the walk's order.
    paths.sort();
    for p in paths {
        let t = read_small(&p)?;
        files.push((p, t));
    }
    Ok(files)
}

/// One directory of [`read_crio`]'s walk: its files (a link too, which CRI-O reads through,
/// not a directory it walks) into `paths`. A directory that is not there holds none.
fn walk(
    top: &Path,
    dir: &Path,
    paths: &mut Vec<PathBuf>,
    seen: &mut usize,
) -> Result<(), ConfigError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        *seen += 1;
        if *seen > MAX_HOOK_FILES {
            return Err(ConfigError::TooManyDropIns {
                dir: top.to_path_buf(),
                max: MAX_HOOK_FILES,
            });
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(top, &e.path(), paths, seen)?;
        } else {
            paths.push(e.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRI-O walks crio.conf.d (filepath.Walk) and reads every file in it, whatever its
    /// name, in directories below too, in the walk's order. A file devgate skipped could set
    /// the crun handler's runtime_path after devgate's 99-devgate-runtime.conf, and
    /// install-host's check and doctor would say CRI-O runs devgate-runtime.
    #[test]
    fn drop_ins_are_the_files_crios_walk_finds() {
        let root = std::env::temp_dir().join(format!("dg-crio-walk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let d = root.join("crio.conf.d");
        crate::fsutil::tests::write_tree(
            &d,
            &[
                (
                    "99-devgate-runtime.conf",
                    "[crio.runtime.runtimes.crun]\nruntime_path = \"/w\"\n",
                ),
                (
                    "zz-override",
                    "[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\n",
                ),
                ("10-a.toml", ""),
                ("50.d/x.conf", ""),
            ],
        );
        let files = read_crio(&root.join("crio.conf")).unwrap();
        let names: Vec<PathBuf> = files
            .iter()
            .map(|(p, _)| p.strip_prefix(&d).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            names,
            [
                "10-a.toml",
                "50.d/x.conf",
                "99-devgate-runtime.conf",
                "zz-override"
            ]
            .map(PathBuf::from)
        );
        let c = parse_crio(&files).unwrap();
        assert_eq!(c.runtime_paths["crun"], "/usr/bin/crun");
        // More files than devgate reads is an error, not a cut.
        for i in 0..MAX_HOOK_FILES {
            fs::write(d.join(format!("many-{i}")), "").unwrap();
        }
        assert!(matches!(
            read_crio(&root.join("crio.conf")).unwrap_err(),
            ConfigError::TooManyDropIns { .. }
        ));
        fs::remove_dir_all(&root).unwrap();
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
        assert_eq!(
            default_runtime_binary(&c),
            ("dg".to_string(), "/usr/bin/devgate-runc".to_string())
        );
        assert_eq!(
            default_runtime_binary(&CrioConfig::default()),
            ("crun".to_string(), "crun".to_string())
        );
        let e = parse_crio(&[("/x".into(), "[crio\n".into())]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Toml { path: Some(p), .. } if p == Path::new("/x")),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("/x: "), "{e}");
    }
}
