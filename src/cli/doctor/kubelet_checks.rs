//! doctor's kubelet lines: devgate's kubelet_pods_dir and kubelet_pod_logs_dir against
//! where the node's kubelet keeps pods and their logs. devgate writes a termination message
//! only below the one and appends its lines to a container's log only below the other, so a
//! directory kubelet does not use costs the pod devgate's line (or, under
//! FallbackToLogsOnError, the app's last log lines).
//!
//! What kubelet uses is read once ([`look`]) from the running kubelet (its `--root-dir`,
//! `--config`, `--config-dir`), or from `--kubelet-config`, or from
//! `<kubelet_pods_dir>/../config.yaml` where no kubelet runs; the cgroup checks read its
//! cgroupDriver from the same file.

use super::error::ConfigError;
use super::kubelet::{self, Running};
use super::kubelet_config;
use super::line::Line;
use super::options::Options;
use super::runtimes;
use crate::config::Config;
use std::path::{Path, PathBuf};

/// kubelet's config file: its path as kubelet names it, and its text.
pub(crate) struct KubeletFile {
    pub(crate) path: PathBuf,
    pub(crate) text: Result<String, ConfigError>,
}

/// What doctor found of the node's kubelet.
pub(crate) struct KubeletView {
    pub(crate) running: Option<Running>,
    /// Its config file (None: none named, and none at the default path).
    pub(crate) file: Option<KubeletFile>,
    /// The running kubelet's `--config-dir` drop-ins, by name, or why they are not read.
    dropins: Result<Vec<KubeletFile>, ConfigError>,
}

/// The node's kubelet as doctor sees it, `proc` being /proc.
pub(crate) fn look(opts: &Options, config: &Config, proc: &Path) -> KubeletView {
    let running = kubelet::find_running(proc);
    let file = match (&opts.kubelet_config, &running) {
        (Some(p), _) => Some(KubeletFile {
            path: p.clone(),
            text: runtimes::read_small(p),
        }),
        (None, Some(r)) => r.flags.config.as_ref().map(|p| match in_root(r, p) {
            Ok(p) => KubeletFile {
                text: kubelet::read_in_root(&r.root, &p),
                path: p,
            },
            Err(e) => KubeletFile {
                path: p.clone(),
                text: Err(e),
            },
        }),
        (None, None) => config
            .kubelet_pods_dir
            .parent()
            .map(|d| d.join("config.yaml"))
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .map(|p| KubeletFile {
                text: runtimes::read_small(&p),
                path: p,
            }),
    };
    let dropins = match (&opts.kubelet_config, &running) {
        (None, Some(r)) => dropins(r),
        _ => Ok(Vec::new()),
    };
    KubeletView {
        running,
        file,
        dropins,
    }
}

/// Path `p` of the running kubelet's flags, inside its root. A relative path is read from
/// its working directory; where that is gone (`cwd` None) it is not read at all, rather
/// than from somewhere else.
fn in_root(r: &Running, p: &Path) -> Result<PathBuf, ConfigError> {
    match &r.cwd {
        _ if p.is_absolute() => Ok(p.to_path_buf()),
        Some(cwd) => Ok(cwd.join(p)),
        None => Err(ConfigError::Kubelet {
            path: p.to_path_buf(),
            msg: format!(
                "a relative path, and kubelet (pid {})'s working directory is gone",
                r.pid
            ),
        }),
    }
}

/// The running kubelet's `--config-dir` drop-ins, read inside its root.
fn dropins(r: &Running) -> Result<Vec<KubeletFile>, ConfigError> {
    let Some(d) = &r.flags.config_dir else {
        return Ok(Vec::new());
    };
    let files = in_root(r, d).and_then(|d| kubelet::dropins_in_root(&r.root, &d))?;
    Ok(files
        .into_iter()
        .map(|p| KubeletFile {
            text: kubelet::read_in_root(&r.root, &p),
            path: p,
        })
        .collect())
}

/// Where kubelet keeps pod logs, and what says so; Err: why that cannot be told.
fn pod_logs_dir(view: &KubeletView) -> Result<(PathBuf, String), String> {
    let mut found = None;
    let from_file = |f: &KubeletFile| -> Result<Option<String>, String> {
        let text = f.text.as_ref().map_err(|e| e.to_string())?;
        kubelet_config::parse_config(text).map_err(|e| format!("{}: {e}", f.path.display()))
    };
    // An empty (or null) podLogsDir is kubelet's default once it defaults the merged config.
    let said = |d: String, f: &KubeletFile| {
        if d.is_empty() {
            (
                kubelet::DEFAULT_POD_LOGS_DIR.to_string(),
                format!(
                    "podLogsDir in {} is empty, kubelet's default",
                    f.path.display()
                ),
            )
        } else {
            (d, format!("podLogsDir in {}", f.path.display()))
        }
    };
    if let Some(f) = &view.file {
        if let Some(d) = from_file(f)? {
            found = Some(said(d, f));
        }
    }
    // Drop-ins override the file, the last in kubelet's walk last.
    for f in view.dropins.as_ref().map_err(|e| e.to_string())? {
        if let Some(d) = from_file(f)? {
            found = Some(said(d, f));
        }
    }
    match (found, &view.file, &view.running) {
        (Some((d, how)), _, _) => Ok((PathBuf::from(d), how)),
        (None, Some(f), _) => Ok((
            kubelet::DEFAULT_POD_LOGS_DIR.into(),
            format!("{} sets no podLogsDir, kubelet's default", f.path.display()),
        )),
        (None, None, Some(r)) => Ok((
            kubelet::DEFAULT_POD_LOGS_DIR.into(),
            format!("kubelet (pid {}) runs with no --config, its default", r.pid),
        )),
        (None, None, None) => Err(no_kubelet()),
    }
}

fn no_kubelet() -> String {
    "no kubelet runs here and no kubelet config was found (name it with --kubelet-config)"
        .to_string()
}

/// Where kubelet keeps pods (`<root-dir>/pods`), and what says so. `--root-dir` is a flag
/// only: without a running kubelet it cannot be told.
fn pods_dir(view: &KubeletView) -> Result<(PathBuf, String), String> {
    let Some(r) = &view.running else {
        return Err(format!(
            "no kubelet runs here, and its --root-dir is on its command line only{}",
            if view.file.is_some() {
                ""
            } else {
                " (no kubelet config was found either)"
            }
        ));
    };
    Ok(match &r.flags.root_dir {
        Some(d) => (
            d.join("pods"),
            format!("kubelet (pid {}) --root-dir {}", r.pid, d.display()),
        ),
        None => (
            Path::new(kubelet::DEFAULT_ROOT_DIR).join("pods"),
            format!(
                "kubelet (pid {}) runs with no --root-dir, its default",
                r.pid
            ),
        ),
    })
}

/// One directory judged: devgate's `key` (`ours`) against kubelet's (`theirs`).
fn dir_line(
    key: &str,
    ours: &Path,
    theirs: Result<(PathBuf, String), String>,
    lost: &str,
    config_path: &Path,
) -> Line {
    match theirs {
        Err(why) => Line::note(key, format!("{}; cannot tell: {why}", ours.display())),
        Ok((dir, how)) if dir == ours => Line::pass(key, format!("{}, as {how}", ours.display())),
        Ok((dir, how)) => Line::fail(
            key,
            format!(
                "{}, but kubelet uses {} ({how}): {lost}",
                ours.display(),
                dir.display()
            ),
            format!(
                "set {key} to {:?} in {}",
                dir.display().to_string(),
                config_path.display()
            ),
        ),
    }
}

/// The two lines: kubelet_pods_dir, then kubelet_pod_logs_dir.
pub(crate) fn kubelet_checks(view: &KubeletView, config: &Config, config_path: &Path) -> Vec<Line> {
    vec![
        dir_line(
            "kubelet_pods_dir",
            &config.kubelet_pods_dir,
            pods_dir(view),
            "devgate writes no termination message kubelet reads, so a pod's message lacks \
             devgate's line",
            config_path,
        ),
        dir_line(
            "kubelet_pod_logs_dir",
            &config.kubelet_pod_logs_dir,
            pod_logs_dir(view),
            "devgate appends its line to no log kubelet reads, so a FallbackToLogsOnError \
             pod's message lacks it",
            config_path,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::doctor::kubelet::Flags;
    use crate::cli::doctor::line::Mark;

    fn running(root_dir: Option<&str>) -> Running {
        Running {
            pid: 42,
            flags: Flags {
                root_dir: root_dir.map(PathBuf::from),
                ..Flags::default()
            },
            root: "/proc/42/root".into(),
            cwd: None,
        }
    }

    fn file(path: &str, text: &str) -> Option<KubeletFile> {
        Some(KubeletFile {
            path: path.into(),
            text: Ok(text.into()),
        })
    }

    fn config(pods: &str, logs: &str) -> Config {
        Config {
            kubelet_pods_dir: pods.into(),
            kubelet_pod_logs_dir: logs.into(),
            ..Config::default()
        }
    }

    fn render(view: &KubeletView, c: &Config) -> Vec<String> {
        kubelet_checks(view, c, Path::new("/etc/devgate/config.json"))
            .iter()
            .map(Line::render)
            .collect()
    }

    #[test]
    fn defaults_agree() {
        let view = KubeletView {
            running: Some(running(None)),
            file: file(
                "/var/lib/kubelet/config.yaml",
                include_str!("../../../tests/fixtures/kubelet/kubeadm-defaulted.yaml"),
            ),
            dropins: Ok(Vec::new()),
        };
        assert_eq!(
            render(&view, &Config::default()),
            [
                "✓ kubelet_pods_dir: /var/lib/kubelet/pods, as kubelet (pid 42) runs with no \
                 --root-dir, its default",
                "✓ kubelet_pod_logs_dir: /var/log/pods, as /var/lib/kubelet/config.yaml sets no \
                 podLogsDir, kubelet's default",
            ]
        );
    }

    #[test]
    fn kubelets_own_dirs_fail_devgates_defaults() {
        let view = KubeletView {
            running: Some(running(Some("/data/kubelet"))),
            file: file(
                "/etc/kubelet.yaml",
                include_str!("../../../tests/fixtures/kubelet/kubeadm-podlogsdir.yaml"),
            ),
            dropins: Ok(Vec::new()),
        };
        let lines = render(&view, &Config::default());
        assert_eq!(
            lines,
            [
                "✗ kubelet_pods_dir: /var/lib/kubelet/pods, but kubelet uses /data/kubelet/pods \
                 (kubelet (pid 42) --root-dir /data/kubelet): devgate writes no termination \
                 message kubelet reads, so a pod's message lacks devgate's line\n  fix: set \
                 kubelet_pods_dir to \"/data/kubelet/pods\" in /etc/devgate/config.json",
                "✗ kubelet_pod_logs_dir: /var/log/pods, but kubelet uses /data/log/pods \
                 (podLogsDir in /etc/kubelet.yaml): devgate appends its line to no log kubelet \
                 reads, so a FallbackToLogsOnError pod's message lacks it\n  fix: set \
                 kubelet_pod_logs_dir to \"/data/log/pods\" in /etc/devgate/config.json",
            ]
        );
        // A trailing slash is the same directory.
        let c = config("/data/kubelet/pods/", "/data/log/pods");
        let marks: Vec<Mark> = kubelet_checks(&view, &c, Path::new("/c.json"))
            .iter()
            .map(|l| l.mark)
            .collect();
        assert_eq!(marks, [Mark::Pass, Mark::Pass]);
    }

    #[test]
    fn a_drop_in_overrides_the_file() {
        let view = KubeletView {
            running: Some(running(None)),
            file: file("/etc/k.yaml", "podLogsDir: /a\n"),
            dropins: Ok(vec![
                KubeletFile {
                    path: "/etc/k.d/10.conf".into(),
                    text: Ok("podLogsDir: /b\n".into()),
                },
                KubeletFile {
                    path: "/etc/k.d/20.conf".into(),
                    text: Ok("cgroupDriver: systemd\n".into()),
                },
            ]),
        };
        assert_eq!(
            pod_logs_dir(&view),
            Ok(("/b".into(), "podLogsDir in /etc/k.d/10.conf".into()))
        );
    }

    /// kubelet merges a drop-in as a JSON merge patch: `podLogsDir: null` there removes
    /// the file's, and kubelet's defaulting then sets an empty or removed one to
    /// /var/log/pods. doctor must neither keep the file's directory nor tell the operator
    /// to set an empty one.
    #[test]
    fn a_null_or_empty_pod_logs_dir_is_kubelets_default() {
        let dropin = |text: &str| KubeletView {
            running: Some(running(None)),
            file: file("/etc/k.yaml", "podLogsDir: /data/logs\n"),
            dropins: Ok(vec![KubeletFile {
                path: "/etc/k.d/10.conf".into(),
                text: Ok(text.into()),
            }]),
        };
        for text in ["podLogsDir: null\n", "podLogsDir:\n", "podLogsDir: \"\"\n"] {
            assert_eq!(
                pod_logs_dir(&dropin(text)),
                Ok((
                    "/var/log/pods".into(),
                    "podLogsDir in /etc/k.d/10.conf is empty, kubelet's default".into()
                )),
                "{text:?}"
            );
        }
        // In the file itself, an empty one is the default too.
        let view = KubeletView {
            running: Some(running(None)),
            file: file("/etc/k.yaml", "podLogsDir: ''\n"),
            dropins: Ok(Vec::new()),
        };
        assert_eq!(
            render(&view, &config("/var/lib/kubelet/pods", "/var/log/pods"))[1],
            "✓ kubelet_pod_logs_dir: /var/log/pods, as podLogsDir in /etc/k.yaml is empty, \
             kubelet's default"
        );
    }

    /// A relative `--config` is kubelet's working directory's. Where that directory is gone,
    /// /proc/PID/cwd reads `/dir (deleted)`: a directory any user may make in /tmp, with a
    /// config doctor would then read as kubelet's. Such a file is not read.
    #[test]
    fn a_relative_config_in_a_deleted_directory_is_not_read() {
        use std::fs;
        use std::os::unix::fs::symlink;
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-cwd");
        let proc = d.join("proc");
        let root = d.join("root");
        fs::create_dir_all(root.join("tmp/kube (deleted)")).unwrap();
        fs::write(
            root.join("tmp/kube (deleted)/k.yaml"),
            "podLogsDir: /planted\n",
        )
        .unwrap();
        for (pid, comm, cmdline) in [
            (1, "systemd", "/sbin/init\0"),
            (5, "kubelet", "kubelet\0--config\0k.yaml\0"),
        ] {
            let p = proc.join(pid.to_string());
            fs::create_dir_all(p.join("ns")).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(p.join("cmdline"), cmdline).unwrap();
            fs::write(p.join("status"), "Uid:\t0\t0\t0\t0\n").unwrap();
            symlink("mnt:[4026531841]", p.join("ns/mnt")).unwrap();
            symlink(&root, p.join("root")).unwrap();
        }
        symlink("1", proc.join("self")).unwrap();
        symlink("/tmp/kube (deleted)", proc.join("5/cwd")).unwrap();
        let view = look(&Options::default(), &Config::default(), &proc);
        assert_eq!(view.running.as_ref().map(|r| r.pid), Some(5));
        let f = view.file.as_ref().unwrap();
        assert!(f.text.is_err(), "{:?}", f.text);
        assert!(pod_logs_dir(&view).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// Where kubelet cannot be found, or its file not read, the lines are notes: nothing
    /// was checked.
    #[test]
    fn what_cannot_be_told_is_a_note() {
        let none = KubeletView {
            running: None,
            file: None,
            dropins: Ok(Vec::new()),
        };
        assert_eq!(
            render(&none, &Config::default()),
            [
                "- kubelet_pods_dir: /var/lib/kubelet/pods; cannot tell: no kubelet runs here, \
                 and its --root-dir is on its command line only (no kubelet config was found \
                 either)",
                "- kubelet_pod_logs_dir: /var/log/pods; cannot tell: no kubelet runs here and no \
                 kubelet config was found (name it with --kubelet-config)",
            ]
        );
        let broken = KubeletView {
            running: None,
            file: file("/k.yaml", "podLogsDir: \"/x\x1b[2J\n"),
            dropins: Ok(Vec::new()),
        };
        let lines = render(&broken, &Config::default());
        assert_eq!(
            lines[1],
            "- kubelet_pod_logs_dir: /var/log/pods; cannot tell: /k.yaml: podLogsDir: a quoted \
             string that does not end on its line"
        );
        // Odd text from kubelet's file is printed escaped.
        let odd = KubeletView {
            running: None,
            file: file("/k.yaml", "podLogsDir: \"/x\\e[2J\"\n"),
            dropins: Ok(Vec::new()),
        };
        let lines = render(&odd, &Config::default());
        assert!(
            lines[1]
                .starts_with("✗ kubelet_pod_logs_dir: /var/log/pods, but kubelet uses /x\\x1b[2J "),
            "{}",
            lines[1]
        );
    }
}
