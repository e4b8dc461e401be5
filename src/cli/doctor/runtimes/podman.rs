//! podman's containers.conf: the hooks directories podman reads. containers/common reads
//! /usr/share/containers/containers.conf, then /etc/containers/containers.conf, each
//! followed by its `.d` drop-ins sorted by name; CONTAINERS_CONF replaces them all. Without
//! `[engine] hooks_dir` podman (4 and 5) reads /usr/share/containers/oci/hooks.d alone.

use super::files::{read_small, toml_error, MAX_HOOK_FILES};
use crate::cli::doctor::error::ConfigError;
use crate::cli::hooks_config::PACKAGE_HOOKS_DIR;
use std::fs;
use std::path::{Path, PathBuf};

/// The files podman reads, relative to the root, each followed by its drop-in directory.
const CONTAINERS_CONFS: [&str; 2] = [
    "usr/share/containers/containers.conf",
    "etc/containers/containers.conf",
];

/// podman's hooks directories: containers.conf's `[engine] hooks_dir` over the files in
/// order, a later file's list replacing an earlier one's unless it ends in podman 5's
/// `{append=true}`; containers/common's DefaultHooksDirs where none sets it.
pub(crate) fn podman_hook_dirs(files: &[(PathBuf, String)]) -> Result<Vec<PathBuf>, ConfigError> {
    let mut dirs: Vec<PathBuf> = vec![PACKAGE_HOOKS_DIR.into()];
    for (path, text) in files {
        let v: toml::Value = toml::from_str(text).map_err(|e| toml_error(Some(path), &e))?;
        let Some(list) = v.get("engine").and_then(|e| e.get("hooks_dir")) else {
            continue;
        };
        let bad = || ConfigError::HooksDirNotPaths(path.clone());
        let items = list.as_array().ok_or_else(bad)?;
        let (append, paths) = match items.split_last() {
            Some((toml::Value::Table(t), rest)) => (
                t.get("append").and_then(toml::Value::as_bool) == Some(true),
                rest,
            ),
            _ => (false, &items[..]),
        };
        let new = paths
            .iter()
            .map(|p| p.as_str().map(PathBuf::from).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?;
        if append {
            dirs.extend(new);
        } else {
            dirs = new;
        }
    }
    Ok(dirs)
}

/// The containers.conf files podman reads on this node, honouring CONTAINERS_CONF as
/// podman does.
pub(crate) fn read_containers_confs() -> Vec<(PathBuf, String)> {
    let only = std::env::var_os("CONTAINERS_CONF").map(PathBuf::from);
    containers_confs_under(Path::new("/"), only.as_deref())
}

/// The containers.conf files under `root` podman reads, in its order; `only` is
/// CONTAINERS_CONF. A file that is not there is skipped, as podman skips it.
pub(crate) fn containers_confs_under(root: &Path, only: Option<&Path>) -> Vec<(PathBuf, String)> {
    let paths: Vec<PathBuf> = match only {
        Some(p) => vec![p.to_path_buf()],
        None => CONTAINERS_CONFS
            .iter()
            .flat_map(|f| {
                // Then containers.conf.d, then containers.rootful.conf.d: podman run by
                // root (as devgate runs) reads that last (containers-config(5)), so a
                // drop-in there wins over devgate's.
                let main = root.join(f);
                let mut v = vec![main.clone()];
                v.extend(drop_ins(&main.with_extension("conf.d")));
                v.extend(drop_ins(&main.with_extension("rootful.conf.d")));
                v
            })
            .collect(),
    };
    paths
        .into_iter()
        .filter_map(|f| read_small(&f).ok().map(|t| (f, t)))
        .collect()
}

/// The `*.conf` files in `dir`, sorted by name, bounded.
fn drop_ins(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .take(MAX_HOOK_FILES)
        .collect();
    v.sort();
    v
}

/// podman's runtime as far as devgate's reject line goes: crun sends a hook's output to
/// /dev/null, so where podman runs crun only devgate's runtime wrapper gets the line to
/// podman's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodmanRuntime {
    /// The runtime's path is devgate's wrapper.
    Wrapper(PathBuf),
    /// crun (podman's default) without the wrapper: hooks alone.
    Crun(String),
    /// Another runtime (runc passes a hook's stderr on).
    Other(String),
}

/// containers.conf's `[engine] runtime` (default crun) and its `[engine.runtimes]` paths,
/// a later file's value replacing an earlier one's.
pub(crate) fn podman_runtime(files: &[(PathBuf, String)]) -> Result<PodmanRuntime, ConfigError> {
    let mut name = "crun".to_string();
    let mut paths: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for (path, text) in files {
        let bad = |what: &'static str| ConfigError::Engine {
            path: path.clone(),
            what,
        };
        let v: toml::Value = toml::from_str(text).map_err(|e| toml_error(Some(path), &e))?;
        let Some(engine) = v.get("engine") else {
            continue;
        };
        if let Some(r) = engine.get("runtime") {
            name = r
                .as_str()
                .ok_or_else(|| bad("runtime is not a name"))?
                .into();
        }
        let Some(t) = engine.get("runtimes").and_then(toml::Value::as_table) else {
            continue;
        };
        for (k, list) in t {
            let list = list
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p.as_str().map(PathBuf::from))
                        .collect()
                })
                .ok_or_else(|| bad("runtimes holds a value that is not a list of paths"))?;
            paths.retain(|(n, _)| n != k);
            paths.push((k.clone(), list));
        }
    }
    Ok(judge_runtime(name, &paths))
}

/// podman resolves a runtime name to the first of its `[engine.runtimes]` paths that
/// exists; doctor asks whether any of them is devgate's wrapper or crun.
fn judge_runtime(name: String, paths: &[(String, Vec<PathBuf>)]) -> PodmanRuntime {
    let file_is = |p: &Path, want: &str| p.file_name().is_some_and(|f| f == want);
    let own: Vec<PathBuf> = paths
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| vec![PathBuf::from(&name)]);
    if let Some(w) = own.iter().find(|p| file_is(p, crate::wrapper::PROGRAM)) {
        return PodmanRuntime::Wrapper(w.clone());
    }
    if own.iter().any(|p| file_is(p, "crun")) {
        return PodmanRuntime::Crun(name);
    }
    PodmanRuntime::Other(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn conf(name: &str, text: &str) -> (PathBuf, String) {
        (PathBuf::from(name), text.to_string())
    }

    fn dirs(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    /// containers/common's DefaultHooksDirs: podman 4 and 5 read /usr/share's directory
    /// alone unless hooks_dir names others; /etc/containers/oci/hooks.d is not read.
    #[test]
    fn default_is_the_package_directory_alone() {
        assert_eq!(
            podman_hook_dirs(&[]).unwrap(),
            dirs(&["/usr/share/containers/oci/hooks.d"])
        );
        let debian = conf(
            "/usr/share/containers/containers.conf",
            "[engine]\n#hooks_dir = [\"/usr/share/containers/oci/hooks.d\"]\n",
        );
        assert_eq!(
            podman_hook_dirs(&[debian]).unwrap(),
            dirs(&["/usr/share/containers/oci/hooks.d"])
        );
    }

    /// A later file's hooks_dir replaces an earlier one's (podman 4); podman 5's
    /// `{append=true}` last element adds to it instead.
    #[test]
    fn later_files_replace_or_append() {
        let a = conf(
            "/etc/containers/containers.conf",
            "[engine]\nhooks_dir = [\"/a\"]\n",
        );
        let b = conf(
            "/etc/containers/containers.conf.d/10-b.conf",
            "[engine]\nhooks_dir = [\"/b\", \"/c\"]\n",
        );
        assert_eq!(
            podman_hook_dirs(&[a.clone(), b.clone()]).unwrap(),
            dirs(&["/b", "/c"])
        );
        let app = conf(
            "/etc/containers/containers.conf.d/20-d.conf",
            "[engine]\nhooks_dir = [\"/d\", {append=true}]\n",
        );
        assert_eq!(
            podman_hook_dirs(&[a.clone(), app.clone()]).unwrap(),
            dirs(&["/a", "/d"])
        );
        assert_eq!(
            podman_hook_dirs(&[app]).unwrap(),
            dirs(&["/usr/share/containers/oci/hooks.d", "/d"])
        );
        // A file podman cannot read stops podman too; doctor says which.
        let bad = conf("/etc/containers/containers.conf", "[engine\n");
        let e = podman_hook_dirs(&[bad]).unwrap_err();
        assert!(matches!(e, ConfigError::Toml { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("/etc/containers/containers.conf: "),
            "{e}"
        );
    }

    /// The files podman reads: CONTAINERS_CONF alone where set; else the two files and the
    /// drop-ins in containers.conf.d, sorted by name, `.conf` only.
    #[test]
    fn which_files_are_read() {
        let root = std::env::temp_dir().join(format!("dg-podman-conf-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        crate::fsutil::tests::write_tree(
            &root,
            &[
                ("usr/share/containers/containers.conf", "u"),
                ("etc/containers/containers.conf", "e"),
                ("etc/containers/containers.conf.d/20-b.conf", "b"),
                ("etc/containers/containers.conf.d/10-a.conf", "a"),
                ("etc/containers/containers.conf.d/30-c.conf.rpmsave", "x"),
                ("only.conf", "o"),
            ],
        );
        let texts = |v: Vec<(PathBuf, String)>| v.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
        assert_eq!(
            texts(containers_confs_under(&root, None)),
            ["u", "e", "a", "b"]
        );
        assert_eq!(
            texts(containers_confs_under(&root, Some(&root.join("only.conf")))),
            ["o"]
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// podman run by root reads `containers.rootful.conf.d` after each `containers.conf.d`
    /// (containers-config(5)): a drop-in there naming crun's own path wins over devgate's
    /// 99-devgate-runtime.conf, and doctor and install-host's check must see podman run
    /// crun, not the wrapper.
    #[test]
    fn roots_rootful_drop_ins_are_read_last() {
        let root = std::env::temp_dir().join(format!("dg-podman-rootful-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        crate::fsutil::tests::write_tree(
            &root,
            &[
                ("usr/share/containers/containers.conf", "u"),
                (
                    "usr/share/containers/containers.rootful.conf.d/10.conf",
                    "ur",
                ),
                (
                    "usr/share/containers/containers.rootless.conf.d/10.conf",
                    "ul",
                ),
                (
                    "etc/containers/containers.conf.d/99-devgate-runtime.conf",
                    "d",
                ),
                ("etc/containers/containers.rootful.conf.d/10-crun.conf", "r"),
            ],
        );
        let texts = |v: Vec<(PathBuf, String)>| v.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
        assert_eq!(
            texts(containers_confs_under(&root, None)),
            ["u", "ur", "d", "r"]
        );
        fs::write(
            root.join("etc/containers/containers.conf.d/99-devgate-runtime.conf"),
            "[engine.runtimes]\ncrun = [\"/usr/local/bin/devgate-runtime\"]\n",
        )
        .unwrap();
        fs::write(
            root.join("etc/containers/containers.rootful.conf.d/10-crun.conf"),
            "[engine.runtimes]\ncrun = [\"/usr/bin/crun\"]\n",
        )
        .unwrap();
        fs::write(
            root.join("usr/share/containers/containers.rootful.conf.d/10.conf"),
            "",
        )
        .unwrap();
        fs::write(root.join("usr/share/containers/containers.conf"), "").unwrap();
        assert_eq!(
            podman_runtime(&containers_confs_under(&root, None)).unwrap(),
            PodmanRuntime::Crun("crun".into())
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// podman's default is crun; a runtime named in `[engine.runtimes]` whose path is
    /// devgate-runtime is the wrapper; runc is another runtime; a later file wins.
    #[test]
    fn the_runtime_podman_runs() {
        use PodmanRuntime::*;
        assert_eq!(podman_runtime(&[]).unwrap(), Crun("crun".into()));
        let debian = conf(
            "/usr/share/containers/containers.conf",
            "[engine]\n#runtime = \"crun\"\n",
        );
        assert_eq!(podman_runtime(&[debian]).unwrap(), Crun("crun".into()));
        let runc = conf(
            "/etc/containers/containers.conf",
            "[engine]\nruntime = \"runc\"\n",
        );
        assert_eq!(
            podman_runtime(std::slice::from_ref(&runc)).unwrap(),
            Other("runc".into())
        );
        let wrapper = conf(
            "/etc/containers/containers.conf.d/devgate-runtime.conf",
            "[engine]\nruntime = \"devgate\"\n[engine.runtimes]\ndevgate = [\"/usr/bin/devgate-runtime\"]\n",
        );
        assert_eq!(
            podman_runtime(&[runc, wrapper]).unwrap(),
            Wrapper("/usr/bin/devgate-runtime".into())
        );
        // a name with no paths of its own, or paths to crun, is crun
        let named = conf(
            "/etc/containers/containers.conf",
            "[engine]\nruntime = \"fast\"\n[engine.runtimes]\nfast = [\"/opt/crun/bin/crun\"]\n",
        );
        assert_eq!(podman_runtime(&[named]).unwrap(), Crun("fast".into()));
        let bad = conf("/etc/containers/containers.conf", "[engine]\nruntime = 3\n");
        let e = podman_runtime(&[bad]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/containers/containers.conf: [engine] runtime is not a name"
        );
    }
}
