//! The container's termination-message file, where kubelet looks for why a container
//! ended. devgate writes its fault line first, then what the application wrote, and only to
//! kubelet's own file for this container: `<kubelet_pods_dir>/<pod uid>/containers/<name>/<file>`,
//! with the pod uid and container name from the runtime's CRI annotations. Which mount
//! the pod's terminationMessagePath names does not matter: a pod can point it at a
//! read-only subPath volume, whose source is a host file devgate must never write.
//!
//! The file is opened relative to kubelet_pods_dir with openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV), non-blocking, and must be a regular file on a
//! writable mount; never past the 4096 bytes kubelet reads.

use crate::error::{Error, Result};
use crate::oci::spec::Spec;
use crate::report::error::TargetError;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// kubelet reads at most this much of the file (MaxContainerTerminationMessageLength).
pub const KUBELET_LIMIT: usize = 4096;

/// The CRI annotations naming the pod uid and the container name, each as (containerd's
/// key, CRI-O's key). Each runtime sets its own after any pass-through annotations, but a
/// pod can write the other runtime's (CRI-O copies every pod annotation into the spec), so
/// both are read and a disagreement names no file (`Spec::cri_annotation`).
pub(crate) const UID_KEYS: (&str, &str) =
    ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid");
pub(crate) const NAME_KEYS: (&str, &str) = (
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
);

/// What happened to the termination message, for the exit record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delivery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<PathBuf>,
    pub written: bool,
    pub note: String,
    /// Under FallbackToLogsOnError with the file left empty: what was appended to the
    /// container's log (`report::pod_log`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// The file was left empty for kubelet to read the log instead.
    #[serde(skip)]
    pub left_for_logs: bool,
}

/// One path component kubelet could have made: not empty, no '/', not '.' or '..'.
pub(crate) fn plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// kubelet's termination file for this container: the source of the bind mount that is
/// `<pods_dir>/<pod uid>/containers/<container name>/<file>`. Err says why there is none.
pub fn host_file(
    spec: &Spec,
    state_annotations: &BTreeMap<String, String>,
    pods_dir: &Path,
) -> std::result::Result<PathBuf, TargetError> {
    let (uid, name) = match (
        spec.cri_annotation(state_annotations, UID_KEYS)?,
        spec.cri_annotation(state_annotations, NAME_KEYS)?,
    ) {
        (Some(u), Some(n)) => (u, n),
        _ => return Err(TargetError::NoPodAnnotations),
    };
    if !plain_name(uid) || !plain_name(name) {
        return Err(TargetError::PodNamesNotPlain);
    }
    let dir = pods_dir.join(uid).join("containers").join(name);
    let found = spec
        .mounts
        .iter()
        .rev()
        .filter(|m| m.is_bind())
        .filter_map(|m| m.source.clone())
        .find(|src| {
            let mut rest = match src.strip_prefix(&dir) {
                Ok(r) => r.components(),
                Err(_) => return false,
            };
            matches!(rest.next(), Some(Component::Normal(_))) && rest.next().is_none()
        });
    found.ok_or(TargetError::NoTerminationMount { dir })
}

/// kubelet's terminationMessagePolicy, from the container annotation it sets (labels.go's
/// `io.kubernetes.container.terminationMessagePolicy`). containerd copies it into the spec
/// only where the runtime's `container_annotations` lets it through; without it the
/// policy reads as kubelet's default, `File`. A pod can forge it only to its own loss:
/// under FallbackToLogsOnError devgate writes less, never log text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagePolicy {
    File,
    FallbackToLogsOnError,
}

pub const POLICY_KEY: &str = "io.kubernetes.container.terminationMessagePolicy";

pub fn policy(spec: &Spec, state_annotations: &BTreeMap<String, String>) -> MessagePolicy {
    match spec.annotation(state_annotations, POLICY_KEY) {
        Some("FallbackToLogsOnError") => MessagePolicy::FallbackToLogsOnError,
        _ => MessagePolicy::File,
    }
}

/// The file's new content: devgate's lines first, then the end of what the application
/// wrote (`app_tail`, the last bytes kubelet would have read) as far as it fits in
/// KUBELET_LIMIT. First, because kubelet keeps the file's last 4096 bytes and its status
/// manager then the message's first 12288 / (number of containers): only the front of a
/// file of at most 4096 bytes survives both. The app's end, not its start, because the
/// end is what kubelet itself shows of a file too long (`tail.ReadAtMost`).
pub fn compose(lines: &[String], app_tail: &[u8]) -> Vec<u8> {
    let mut body = lines.join("\n");
    body.push('\n');
    if body.len() > KUBELET_LIMIT {
        let mut cut = KUBELET_LIMIT - 1;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
        body.push('\n');
    }
    let room = KUBELET_LIMIT - body.len();
    let mut from = app_tail.len().saturating_sub(room);
    // Not from the middle of a UTF-8 character: its continuation bytes are skipped.
    while from < app_tail.len() && from > 0 && (app_tail[from] & 0xC0) == 0x80 {
        from += 1;
    }
    let mut out = body.into_bytes();
    out.extend_from_slice(&app_tail[from..]);
    out
}

fn open_error(what: &str, root_key: &str, path: &Path, e: std::io::Error) -> Error {
    let why = match e.raw_os_error() {
        Some(libc::ELOOP) => "a component is a symlink".to_string(),
        Some(libc::EXDEV) => format!("it crosses a mount point or leaves {root_key}"),
        Some(libc::ENOSYS) => "openat2 is not available (Linux 5.6 or later)".to_string(),
        _ => return Error::io(what, path, e),
    };
    Error::unsafe_path(path, why)
}

/// Opens `path` for appending when it is a regular file below `root` on root's own mount,
/// reached without any symlink. `root` itself is the operator's configuration and may be
/// a symlink (kubelet's directory often is).
pub fn open_below(root: &Path, path: &Path) -> Result<File> {
    open_below_in(root, "kubelet_pods_dir", path)
}

/// [`open_below`] for the root named `root_key` in the config, for messages.
pub fn open_below_in(root: &Path, root_key: &str, path: &Path) -> Result<File> {
    let rel = path.strip_prefix(root).map_err(|_| {
        Error::unsafe_path(path, format!("not below {root_key} {}", root.display()))
    })?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::unsafe_path(path, "has a '..' or '.' component"));
    }
    if rel.as_os_str().is_empty() {
        return Err(Error::unsafe_path(path, format!("is {root_key} itself")));
    }
    let dir = File::open(root).map_err(|e| Error::io("cannot open", root, e))?;
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("termination message path", "contains a NUL byte"))?;
    // O_NONBLOCK: a FIFO planted in its place must not hold poststop (and so runc).
    let flags = libc::O_RDWR
        | libc::O_APPEND
        | libc::O_NOFOLLOW
        | libc::O_NONBLOCK
        | libc::O_NOCTTY
        | libc::O_CLOEXEC;
    let resolve = libc::RESOLVE_BENEATH
        | libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_NO_XDEV
        | libc::RESOLVE_NO_MAGICLINKS;
    let f = File::from(
        crate::fsutil::openat2(&dir, &c, flags, resolve)
            .map_err(|e| open_error("cannot open", root_key, path, e))?,
    );
    let meta = f
        .metadata()
        .map_err(|e| Error::io("cannot stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::unsafe_path(path, "is not a regular file"));
    }
    let vfs = nix::sys::statvfs::fstatvfs(&f)
        .map_err(|e| Error::io("cannot statvfs", path, std::io::Error::from(e)))?;
    if vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Err(Error::unsafe_path(path, "is on a read-only mount"));
    }
    Ok(f)
}

/// The termination message of a container whose run ended with `lines`: kubelet's file
/// for it (from the spec, when the bundle is still there) written as `write` does.
pub fn deliver(
    spec: Option<&Spec>,
    state_annotations: &BTreeMap<String, String>,
    pods_dir: &Path,
    lines: &[String],
) -> Delivery {
    let not_written = |why: &dyn std::fmt::Display| Delivery {
        host_path: None,
        written: false,
        note: format!("not written: {why}"),
        log: None,
        left_for_logs: false,
    };
    let Some(spec) = spec else {
        return not_written(&"no bundle spec");
    };
    match host_file(spec, state_annotations, pods_dir) {
        Ok(h) => write(pods_dir, &h, lines, policy(spec, state_annotations)),
        Err(why) => not_written(&why),
    }
}

/// The last KUBELET_LIMIT bytes of the file, what kubelet reads, and the file's size.
fn read_tail(f: &mut File) -> std::io::Result<(Vec<u8>, u64)> {
    let size = f.metadata()?.len();
    f.seek(SeekFrom::Start(size.saturating_sub(KUBELET_LIMIT as u64)))?;
    let mut tail = Vec::new();
    f.take(KUBELET_LIMIT as u64).read_to_end(&mut tail)?;
    Ok((tail, size))
}

/// Rewrites the termination-message file as devgate's lines, then the application's
/// text ([`compose`]); the outcome says what was done. Under FallbackToLogsOnError a file
/// the application left empty stays empty: kubelet then shows the log's last lines (the
/// app's own error), which any text in the file would hide.
pub fn write(root: &Path, host: &Path, lines: &[String], policy: MessagePolicy) -> Delivery {
    let mut outcome = Delivery {
        host_path: Some(host.to_path_buf()),
        written: false,
        note: String::new(),
        log: None,
        left_for_logs: false,
    };
    let mut f = match open_below(root, host) {
        Ok(f) => f,
        Err(e) => {
            outcome.note = format!("not written: {e}");
            return outcome;
        }
    };
    let (tail, size) = match read_tail(&mut f) {
        Ok(t) => t,
        Err(e) => {
            outcome.note = format!("not written: cannot read {}: {e}", host.display());
            return outcome;
        }
    };
    // A second poststop (runtimes may call it twice) must not write the same line again.
    if let Some(first) = lines.first() {
        if tail.starts_with(first.as_bytes()) {
            outcome.written = true;
            outcome.note = "already written".into();
            return outcome;
        }
    }
    if size == 0 && policy == MessagePolicy::FallbackToLogsOnError {
        outcome.note = "not written: FallbackToLogsOnError and the application wrote no \
                        message: kubelet shows the log's last lines"
            .into();
        outcome.left_for_logs = true;
        return outcome;
    }
    let text = compose(lines, &tail);
    // O_APPEND: after the truncation the write lands at offset 0.
    match f
        .set_len(0)
        .and_then(|_| f.write_all(&text))
        .and_then(|_| f.sync_all())
    {
        Ok(()) => {
            outcome.written = true;
            outcome.note = format!("wrote {} bytes, devgate's first", text.len());
        }
        Err(e) => outcome.note = format!("not written: cannot write {}: {e}", host.display()),
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const LINE: &str =
        "devgate: DeviceFault/XID79 on /dev/nvidia1 (GPU-1): GPU has fallen off the bus";

    #[test]
    fn devgate_first_then_the_apps_end_within_kubelets_limit() {
        let line = vec![LINE.to_string()];
        assert_eq!(compose(&line, b""), format!("{LINE}\n").into_bytes());
        assert_eq!(
            compose(&line, b"app: oops"),
            format!("{LINE}\napp: oops").into_bytes()
        );
        // An app that filled the file: its last bytes follow devgate's whole line.
        let mut app = vec![b'x'; KUBELET_LIMIT - 10];
        app.extend_from_slice(b"app: CUDA error\n");
        let t = compose(&line, &app);
        assert_eq!(t.len(), KUBELET_LIMIT);
        assert!(t.starts_with(format!("{LINE}\nxxx").as_bytes()));
        assert!(t.ends_with(b"xapp: CUDA error\n"));
        // Never from the middle of a character.
        let app = "é".repeat(KUBELET_LIMIT);
        let t = compose(&line, app.as_bytes());
        assert!(std::str::from_utf8(&t).is_ok());
        assert!(t.len() <= KUBELET_LIMIT);
        // devgate's own lines past the limit are cut to it.
        let many: Vec<String> = (0..100).map(|_| LINE.to_string()).collect();
        assert_eq!(compose(&many, b"app").len(), KUBELET_LIMIT);
    }

    #[test]
    fn the_file_is_rewritten_devgate_first_once_and_left_empty_for_the_logs() {
        let d = crate::fsutil::tests::tempdir("term-write");
        let c = d.join("pods/uid/containers/app");
        fs::create_dir_all(&c).unwrap();
        let f = c.join("log");
        let line = vec![LINE.to_string()];
        fs::write(&f, "app said\n").unwrap();
        let root = d.join("pods");
        let o = write(&root, &f, &line, MessagePolicy::File);
        assert!(o.written, "{o:?}");
        assert_eq!(
            fs::read_to_string(&f).unwrap(),
            format!("{LINE}\napp said\n")
        );
        let o = write(&root, &f, &line, MessagePolicy::File);
        assert_eq!(o.note, "already written");
        assert_eq!(
            fs::read_to_string(&f).unwrap(),
            format!("{LINE}\napp said\n")
        );
        // FallbackToLogsOnError: an empty file stays empty, a written one gets the line.
        fs::write(&f, "").unwrap();
        let o = write(&root, &f, &line, MessagePolicy::FallbackToLogsOnError);
        assert!(
            !o.written && o.note.contains("FallbackToLogsOnError"),
            "{o:?}"
        );
        assert_eq!(fs::read(&f).unwrap(), b"");
        fs::write(&f, "app said\n").unwrap();
        assert!(write(&root, &f, &line, MessagePolicy::FallbackToLogsOnError).written);
        assert!(fs::read_to_string(&f).unwrap().starts_with(LINE));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn opens_only_regular_files_below_root_without_symlinks() {
        let d = crate::fsutil::tests::tempdir("term");
        let root = d.join("pods");
        let c = root.join("uid/containers/app");
        fs::create_dir_all(&c).unwrap();
        fs::write(c.join("log"), b"app said\n").unwrap();
        fs::write(d.join("outside"), b"host file\n").unwrap();
        symlink(d.join("outside"), c.join("link")).unwrap();
        symlink(&c, root.join("uid/dirlink")).unwrap();
        nix::unistd::mkfifo(
            &c.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();

        assert!(open_below(&root, &c.join("log")).is_ok());
        for (p, want) in [
            (d.join("outside"), "not below kubelet_pods_dir"),
            (c.join("link"), "a component is a symlink"),
            (root.join("uid/dirlink/log"), "a component is a symlink"),
            (c.join("fifo"), "is not a regular file"),
            (root.join("uid/../../outside"), "'..'"),
        ] {
            let e = open_below(&root, &p).unwrap_err().to_string();
            assert!(e.contains(want), "{}: {e}", p.display());
        }
        let o = write(&root, &c.join("link"), &["x".into()], MessagePolicy::File);
        assert!(!o.written);
        assert_eq!(fs::read(d.join("outside")).unwrap(), b"host file\n");
    }

    fn spec_with(annotations: &[(&str, &str)], sources: &[&str]) -> Spec {
        let mounts: Vec<_> = sources
            .iter()
            .enumerate()
            .map(|(i, s)| serde_json::json!({"destination": format!("/m{i}"), "type": "bind", "source": s, "options": ["rbind"]}))
            .collect();
        let ann: BTreeMap<_, _> = annotations.iter().cloned().collect();
        serde_json::from_value(
            serde_json::json!({"ociVersion": "1.0.2", "mounts": mounts, "annotations": ann}),
        )
        .unwrap()
    }

    #[test]
    fn host_file_is_kubelets_file_named_by_cri_annotations() {
        let pods = Path::new("/k/pods");
        let cd = [
            ("io.kubernetes.cri.sandbox-uid", "u1"),
            ("io.kubernetes.cri.container-name", "app"),
            ("io.kubernetes.container.terminationMessagePath", "/m0"),
        ];
        let s = spec_with(
            &cd,
            &[
                "/k/pods/u1/volume-subpaths/v/app/0",
                "/k/pods/u1/containers/app/1a2b3c4d",
            ],
        );
        let none = BTreeMap::new();
        assert_eq!(
            host_file(&s, &none, pods).unwrap(),
            Path::new("/k/pods/u1/containers/app/1a2b3c4d")
        );
        let crio = [
            ("io.kubernetes.pod.uid", "u1"),
            ("io.kubernetes.container.name", "app"),
        ];
        let s = spec_with(&crio, &["/k/pods/u1/containers/app/x"]);
        assert!(host_file(&s, &none, pods).is_ok());
        for (ann, src) in [
            (&cd[..], "/k/pods/u1/volume-subpaths/v/app/0"),
            (&cd[..], "/k/pods/u1/containers/other/x"),
            (&cd[..], "/k/pods/u1/containers/app/d/x"),
            (&cd[..0], "/k/pods/u1/containers/app/x"),
            (
                &[
                    ("io.kubernetes.cri.sandbox-uid", ".."),
                    ("io.kubernetes.cri.container-name", "app"),
                ][..],
                "/k/pods/../containers/app/x",
            ),
        ] {
            assert!(
                host_file(&spec_with(ann, &[src]), &none, pods).is_err(),
                "{src}"
            );
        }
    }

    #[test]
    fn only_kubelets_fallback_value_reads_as_fallback() {
        let none = BTreeMap::new();
        for (v, want) in [
            (
                "FallbackToLogsOnError",
                MessagePolicy::FallbackToLogsOnError,
            ),
            ("File", MessagePolicy::File),
            ("fallbacktologsonerror", MessagePolicy::File),
        ] {
            assert_eq!(
                policy(&spec_with(&[(POLICY_KEY, v)], &[]), &none),
                want,
                "{v}"
            );
        }
        assert_eq!(policy(&spec_with(&[], &[]), &none), MessagePolicy::File);
    }

    /// CRI-O copies the pod's annotations into the spec: containerd's keys there are the
    /// pod author's, and a pair that disagrees with CRI-O's names no file.
    #[test]
    fn a_pod_cannot_choose_the_file_through_the_other_runtimes_keys() {
        let (pods, none) = (Path::new("/k/pods"), BTreeMap::new());
        let forged = [
            ("io.kubernetes.cri.sandbox-uid", "victim"),
            ("io.kubernetes.cri.container-name", "db"),
            ("io.kubernetes.pod.uid", "u1"),
            ("io.kubernetes.container.name", "app"),
        ];
        let s = spec_with(
            &forged,
            &[
                "/k/pods/victim/containers/db/0badf00d",
                "/k/pods/u1/containers/app/1a2b3c4d",
            ],
        );
        let e = host_file(&s, &none, pods).unwrap_err();
        assert!(matches!(e, TargetError::Conflict(_)), "{e:?}");
        assert!(e.to_string().contains("disagree"), "{e}");
    }
}
