//! podman's containers.conf: the hooks directories podman reads.

use super::read_small;
use std::path::{Path, PathBuf};

/// podman's hooks directories from containers.conf's `[engine] hooks_dir`, else its defaults.
pub(crate) fn podman_hook_dirs(files: &[(PathBuf, String)]) -> Result<Vec<PathBuf>, String> {
    #[derive(serde::Deserialize, Default)]
    struct ContainersConf {
        #[serde(default)]
        engine: Engine,
    }
    #[derive(serde::Deserialize, Default)]
    struct Engine {
        hooks_dir: Option<Vec<PathBuf>>,
    }
    let mut dirs = None;
    for (_, t) in files {
        let set = toml::from_str::<ContainersConf>(t)
            .ok()
            .and_then(|c| c.engine.hooks_dir);
        if set.is_some() {
            dirs = set;
        }
    }
    Ok(dirs.unwrap_or_else(|| {
        vec![
            "/usr/share/containers/oci/hooks.d".into(),
            "/etc/containers/oci/hooks.d".into(),
        ]
    }))
}

/// The containers.conf files podman reads, in its order.
pub(crate) fn read_containers_confs() -> Vec<(PathBuf, String)> {
    containers_confs_under(Path::new("/"), None)
}

/// The containers.conf files under `root` podman reads.
fn containers_confs_under(root: &Path, _only: Option<&Path>) -> Vec<(PathBuf, String)> {
    [
        "usr/share/containers/containers.conf",
        "etc/containers/containers.conf",
    ]
    .iter()
    .map(|f| root.join(f))
    .filter_map(|f| read_small(&f).ok().map(|t| (f, t)))
    .collect()
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
        let a = conf("/etc/containers/containers.conf", "[engine]\nhooks_dir = [\"/a\"]\n");
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
        assert!(e.starts_with("/etc/containers/containers.conf: "), "{e}");
    }

    /// The files podman reads: CONTAINERS_CONF alone where set; else the two files and the
    /// drop-ins in containers.conf.d, sorted by name, `.conf` only.
    #[test]
    fn which_files_are_read() {
        let root = std::env::temp_dir().join(format!("dg-podman-conf-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (p, t) in [
            ("usr/share/containers/containers.conf", "u"),
            ("etc/containers/containers.conf", "e"),
            ("etc/containers/containers.conf.d/20-b.conf", "b"),
            ("etc/containers/containers.conf.d/10-a.conf", "a"),
            ("etc/containers/containers.conf.d/30-c.conf.rpmsave", "x"),
            ("only.conf", "o"),
        ] {
            let f = root.join(p);
            fs::create_dir_all(f.parent().unwrap()).unwrap();
            fs::write(f, t).unwrap();
        }
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
}
