//! The container's CRI log, where kubelet looks under FallbackToLogsOnError when the
//! termination file is empty: the last 2048 bytes of its last 80 lines. devgate appends its
//! fault lines there, in the CRI log format, so that kubelet shows the app's last lines
//! and then devgate's. Only devgate's own lines are written, never log text elsewhere.
//!
//! The file is kubelet's `<namespace>_<pod>_<uid>/<container name>/<restart count>.log`
//! below kubelet_pod_logs_dir. CRI-O puts its path in the spec; containerd passes the
//! log directory only to the sandbox, and neither runtime the restart count. So the
//! directory is built from the CRI annotations as kubelet builds it, and under containerd
//! the newest `<n>.log` is this run's: kubelet numbers them by restart count, which only
//! grows within a pod, and creates the next only after this run's exit is reported. A pod
//! can write either runtime's keys under CRI-O (it copies pod annotations into the spec):
//! both are read, a disagreement names no file, and CRI-O's path counts only in the
//! directory so built.
//!
//! The file is opened as the termination file is ([`termination::open_below_in`]), below
//! `kubelet_pod_logs_dir` only.

use crate::model::text::one_line;
use crate::oci::spec::Spec;
use crate::report::error::TargetError;
use crate::report::termination::{self, NAME_KEYS, UID_KEYS};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// CRI-O's container log path. containerd passes the pod's log directory only to the
/// sandbox's spec, so the path is built as kubelet builds it (BuildPodLogsDirectory).
pub const LOG_PATH_KEY: &str = "io.kubernetes.cri-o.LogPath";
/// The pod's namespace and name, each as (containerd's key, CRI-O's key).
const NAMESPACE_KEYS: (&str, &str) = (
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
);
const POD_NAME_KEYS: (&str, &str) = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name");

/// kubelet shows at most this much of the log (MaxContainerTerminationMessageLogLength):
/// devgate never appends more.
pub const APPEND_LIMIT: usize = 2048;

/// How many names of the container's log directory are looked at, at most.
const DIR_ENTRIES_LIMIT: usize = 4096;

/// `<n>.log`, kubelet's name for attempt n's log; n.
fn attempt_of(name: &str) -> Option<u64> {
    let n = name.strip_suffix(".log")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// The newest `<n>.log` in `dir`, by number. Only names are read here; the file itself is
/// opened without following any symlink.
fn newest_attempt(dir: &Path) -> Result<PathBuf, TargetError> {
    let entries = std::fs::read_dir(dir).map_err(|e| TargetError::CannotList {
        dir: dir.to_path_buf(),
        source: e.into(),
    })?;
    entries
        .take(DIR_ENTRIES_LIMIT)
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((attempt_of(e.file_name().to_str()?)?, e.file_name())))
        .max_by_key(|(n, _)| *n)
        .map(|(_, name)| dir.join(name))
        .ok_or_else(|| TargetError::NoAttempt {
            dir: dir.to_path_buf(),
        })
}

/// One CRI annotation that both runtimes set, as a plain path component.
fn component<'a>(
    spec: &'a Spec,
    state_annotations: &'a BTreeMap<String, String>,
    keys: (&'static str, &'static str),
) -> Result<&'a str, TargetError> {
    match spec.cri_annotation(state_annotations, keys)? {
        Some(v) if termination::plain_name(v) => Ok(v),
        Some(_) => Err(TargetError::NotPlainName { key: keys.0 }),
        None => Err(TargetError::NoAnnotation { keys }),
    }
}

/// kubelet's log directory for this container, below `logs_dir`:
/// `<namespace>_<pod name>_<pod uid>/<container name>`, each from the runtime's
/// annotations. (kubelet's own names hold no `_` but as separators; the pod's uid keeps
/// another pod's directory out of reach all the same.)
pub fn container_log_dir(
    spec: &Spec,
    state_annotations: &BTreeMap<String, String>,
    logs_dir: &Path,
) -> Result<PathBuf, TargetError> {
    let ns = component(spec, state_annotations, NAMESPACE_KEYS)?;
    let pod = component(spec, state_annotations, POD_NAME_KEYS)?;
    let uid = component(spec, state_annotations, UID_KEYS)?;
    let name = component(spec, state_annotations, NAME_KEYS)?;
    Ok(logs_dir.join(format!("{ns}_{pod}_{uid}")).join(name))
}

/// The container's log file: CRI-O's log path where it is in kubelet's directory for this
/// container, else (containerd) the newest `<n>.log` there. Err says why there is none.
pub fn log_file(
    spec: &Spec,
    state_annotations: &BTreeMap<String, String>,
    logs_dir: &Path,
) -> Result<PathBuf, TargetError> {
    let dir = container_log_dir(spec, state_annotations, logs_dir)?;
    let Some(path) = spec.annotation(state_annotations, LOG_PATH_KEY) else {
        return newest_attempt(&dir);
    };
    let path = Path::new(path);
    let attempt = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(attempt_of);
    if path.parent() != Some(dir.as_path()) || attempt.is_none() {
        return Err(TargetError::LogPathElsewhere {
            key: LOG_PATH_KEY,
            dir,
        });
    }
    Ok(path.to_path_buf())
}

/// devgate's lines as CRI log records (`<RFC3339Nano> stderr F <line>`, as containerd and
/// CRI-O write them and kubelet parses them), each escaped, as many as fit APPEND_LIMIT.
pub fn compose(lines: &[String], time: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        let record = format!("{time} stderr F {}\n", one_line(l));
        if out.len() + record.len() > APPEND_LIMIT {
            break;
        }
        out.extend_from_slice(record.as_bytes());
    }
    out
}

/// Whether the log's last bytes already hold `line` as a record: a second poststop.
fn already_there(f: &mut File, line: &str) -> std::io::Result<bool> {
    let size = f.metadata()?.len();
    f.seek(SeekFrom::Start(
        size.saturating_sub(APPEND_LIMIT as u64 * 2),
    ))?;
    let mut tail = Vec::new();
    f.take(APPEND_LIMIT as u64 * 2).read_to_end(&mut tail)?;
    let needle = format!(" stderr F {}\n", one_line(line));
    Ok(tail.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// Appends devgate's lines to the log at `path` below `root` (kubelet_pod_logs_dir), in
/// one write; the outcome says what was done, for the exit record.
pub fn append(root: &Path, path: &Path, lines: &[String]) -> String {
    let mut f = match termination::open_below_in(root, "kubelet_pod_logs_dir", path) {
        Ok(f) => f,
        Err(e) => return format!("log not appended: {e}"),
    };
    match lines.first().map(|l| already_there(&mut f, l)) {
        Some(Ok(true)) => return "log already appended".into(),
        Some(Err(e)) => return format!("log not appended: cannot read {}: {e}", path.display()),
        _ => {}
    }
    let text = compose(lines, &crate::model::clock::now_rfc3339_nano());
    // O_APPEND: after whatever the runtime's log copier wrote last, whole records both.
    match f.write_all(&text) {
        Ok(()) => format!(
            "appended {} bytes to the log {}",
            text.len(),
            path.display()
        ),
        Err(e) => format!("log not appended: cannot write {}: {e}", path.display()),
    }
}

/// The container's log from the spec, appended to as `append` does.
pub fn deliver(
    spec: &Spec,
    state_annotations: &BTreeMap<String, String>,
    logs_dir: &Path,
    lines: &[String],
) -> String {
    match log_file(spec, state_annotations, logs_dir) {
        Ok(p) => append(logs_dir, &p, lines),
        Err(why) => format!("log not appended: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const LINE: &str = "devgate: DeviceFault/XID79 on /dev/nvidia1 (GPU-1): fallen off the bus";
    const CD: [(&str, &str); 4] = [
        ("io.kubernetes.cri.sandbox-namespace", "ml"),
        ("io.kubernetes.cri.sandbox-name", "train"),
        ("io.kubernetes.cri.sandbox-uid", "u1"),
        ("io.kubernetes.cri.container-name", "app"),
    ];

    fn spec_with(annotations: &[(&str, &str)]) -> Spec {
        let ann: BTreeMap<_, _> = annotations.iter().cloned().collect();
        serde_json::from_value(serde_json::json!({"ociVersion": "1.0.2", "annotations": ann}))
            .unwrap()
    }

    #[test]
    fn records_are_cri_log_lines_escaped_and_bounded() {
        let t = "2026-01-02T03:04:05.000000006Z";
        assert_eq!(
            compose(&[LINE.into(), "a\nb\u{1b}".into()], t),
            format!("{t} stderr F {LINE}\n{t} stderr F a\\x0ab\\x1b\n").into_bytes()
        );
        let many: Vec<String> = (0..100).map(|_| LINE.to_string()).collect();
        let out = compose(&many, t);
        assert!(out.len() <= APPEND_LIMIT && out.ends_with(b"bus\n"));
        assert!(crate::model::clock::now_rfc3339_nano().len() == t.len());
    }

    #[test]
    fn the_file_is_kubelets_newest_attempt_or_crios_path_in_the_same_dir() {
        let d = crate::fsutil::tests::tempdir("podlog-find");
        let dir = d.join("ml_train_u1/app");
        fs::create_dir_all(&dir).unwrap();
        for n in [
            "0.log",
            "2.log",
            "10.log",
            "11.log.20260101-000000",
            "x.log",
            "+9.log",
        ] {
            fs::write(dir.join(n), "").unwrap();
        }
        let none = BTreeMap::new();
        assert_eq!(log_file(&spec_with(&CD), &none, &d), Ok(dir.join("10.log")));
        let crio = [
            ("io.kubernetes.pod.namespace", "ml"),
            ("io.kubernetes.pod.name", "train"),
            ("io.kubernetes.pod.uid", "u1"),
            ("io.kubernetes.container.name", "app"),
        ];
        let p = dir.join("2.log");
        let mut a = crio.to_vec();
        a.push((LOG_PATH_KEY, p.to_str().unwrap()));
        assert_eq!(log_file(&spec_with(&a), &none, &d), Ok(p));
        let _ = fs::remove_dir_all(&d);
    }

    /// A pod that writes the other runtime's keys, or CRI-O's log path, names no file but
    /// its own container's log.
    #[test]
    fn a_pod_cannot_choose_another_log() {
        let (d, none) = (Path::new("/var/log/pods"), BTreeMap::new());
        let mut forged = CD.to_vec();
        forged.push(("io.kubernetes.pod.uid", "victim"));
        let e = log_file(&spec_with(&forged), &none, d).unwrap_err();
        assert!(matches!(e, TargetError::Conflict(_)), "{e:?}");
        assert!(e.to_string().contains("disagree"), "{e}");
        for p in [
            "/etc/shadow",
            "/var/log/pods/kube-system_etcd_u0/etcd/0.log",
            "/var/log/pods/ml_train_u1/app/../../x/app/0.log",
            "/var/log/pods/ml_train_u1/app/0.txt",
        ] {
            let mut a = CD.to_vec();
            a.push((LOG_PATH_KEY, p));
            assert!(log_file(&spec_with(&a), &none, d).is_err(), "{p}");
        }
        let mut a = CD.to_vec();
        a[3] = ("io.kubernetes.cri.container-name", "..");
        assert!(log_file(&spec_with(&a), &none, d).is_err());
    }

    #[test]
    fn appends_only_to_regular_files_below_root_without_symlinks() {
        let d = crate::fsutil::tests::tempdir("podlog");
        let root = d.join("logs");
        let c = root.join("ml_train_u1/app");
        fs::create_dir_all(&c).unwrap();
        let app = "2026-01-02T03:04:05.1Z stdout F app: CUDA error\n";
        fs::write(c.join("0.log"), app).unwrap();
        fs::write(d.join("outside"), b"host file\n").unwrap();
        symlink(d.join("outside"), c.join("1.log")).unwrap();
        symlink(&c, root.join("ml_train_u1/dirlink")).unwrap();
        let fifo = nix::sys::stat::Mode::from_bits_truncate(0o600);
        nix::unistd::mkfifo(&c.join("2.log"), fifo).unwrap();

        let line = vec![LINE.to_string()];
        let o = append(&root, &c.join("0.log"), &line);
        assert!(o.starts_with("appended"), "{o}");
        let log = fs::read_to_string(c.join("0.log")).unwrap();
        let rest = log.strip_prefix(app).unwrap();
        assert!(rest.ends_with(&format!("Z stderr F {LINE}\n")), "{log}");
        assert_eq!(
            append(&root, &c.join("0.log"), &line),
            "log already appended"
        );
        assert_eq!(fs::read_to_string(c.join("0.log")).unwrap(), log);
        for (p, want) in [
            (d.join("outside"), "not below kubelet_pod_logs_dir"),
            (c.join("1.log"), "a component is a symlink"),
            (
                root.join("ml_train_u1/dirlink/0.log"),
                "a component is a symlink",
            ),
            (c.join("2.log"), "is not a regular file"),
            (root.join("ml_train_u1/../../outside"), "'..'"),
        ] {
            let o = append(&root, &p, &line);
            assert!(o.contains(want), "{}: {o}", p.display());
        }
        assert_eq!(fs::read(d.join("outside")).unwrap(), b"host file\n");
        let _ = fs::remove_dir_all(&d);
    }
}
