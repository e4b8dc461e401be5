//! The container's termination-message file, where kubelet looks for why a container
//! ended. devgate appends its fault line after what the application wrote, and only to
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
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// kubelet reads at most this much of the file (MaxContainerTerminationMessageLength).
pub const KUBELET_LIMIT: usize = 4096;

/// The CRI annotations naming the pod uid and the container name, each as (containerd's
/// key, CRI-O's key). Each runtime sets its own after any pass-through annotations, but a
/// pod can write the other runtime's (CRI-O copies every pod annotation into the spec), so
/// both are read and a disagreement names no file (`Spec::cri_annotation`).
const UID_KEYS: (&str, &str) = ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid");
const NAME_KEYS: (&str, &str) = (
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
}

/// One path component kubelet could have made: not empty, no '/', not '.' or '..'.
fn plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// kubelet's termination file for this container: the source of the bind mount that is
/// `<pods_dir>/<pod uid>/containers/<container name>/<file>`. Err says why there is none.
pub fn host_file(
    spec: &Spec,
    state_annotations: &BTreeMap<String, String>,
    pods_dir: &Path,
) -> std::result::Result<PathBuf, String> {
    let (uid, name) = match (
        spec.cri_annotation(state_annotations, UID_KEYS)?,
        spec.cri_annotation(state_annotations, NAME_KEYS)?,
    ) {
        (Some(u), Some(n)) => (u, n),
        _ => return Err("no CRI pod uid and container name annotations".into()),
    };
    if !plain_name(uid) || !plain_name(name) {
        return Err("the CRI pod uid or container name is not a plain file name".into());
    }
    let dir = pods_dir.join(uid).join("containers").join(name);
    spec.mounts
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
        })
        .ok_or_else(|| {
            format!(
                "no bind mount of kubelet's termination file in {}",
                dir.display()
            )
        })
}

/// The text to append: `lines` after the app's `existing` bytes (`ends_in_newline` says
/// whether the app ended its last line), trimmed so the whole stays within the limit. None
/// when not even a short line fits.
pub fn text_to_append(existing: usize, ends_in_newline: bool, lines: &[String]) -> Option<String> {
    const MIN_USEFUL: usize = 24;
    let mut room = KUBELET_LIMIT.checked_sub(existing)?;
    let mut text = String::new();
    if existing > 0 && !ends_in_newline {
        text.push('\n');
        room = room.checked_sub(1)?;
    }
    let mut body = lines.join("\n");
    body.push('\n');
    if body.len() > room {
        if room < MIN_USEFUL {
            return None;
        }
        let mut cut = room - 1;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
        body.push('\n');
    }
    text.push_str(&body);
    Some(text)
}

fn open_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    let why = match e.raw_os_error() {
        Some(libc::ELOOP) => "a component is a symlink".to_string(),
        Some(libc::EXDEV) => "it crosses a mount point or leaves kubelet_pods_dir".to_string(),
        Some(libc::ENOSYS) => "openat2 is not available (Linux 5.6 or later)".to_string(),
        _ => return Error::io(what, path, e),
    };
    Error::unsafe_path(path, why)
}

/// Opens `path` for appending when it is a regular file below `root` on root's own mount,
/// reached without any symlink. `root` itself is the operator's configuration and may be
/// a symlink (kubelet's directory often is).
pub fn open_below(root: &Path, path: &Path) -> Result<File> {
    let rel = path.strip_prefix(root).map_err(|_| {
        Error::unsafe_path(
            path,
            format!("not below kubelet_pods_dir {}", root.display()),
        )
    })?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::unsafe_path(path, "has a '..' or '.' component"));
    }
    if rel.as_os_str().is_empty() {
        return Err(Error::unsafe_path(path, "is kubelet_pods_dir itself"));
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
            .map_err(|e| open_error("cannot open", path, e))?,
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

/// Appends the fault lines to the termination-message file; the outcome says what was done.
pub fn append(root: &Path, host: &Path, lines: &[String]) -> Delivery {
    let mut outcome = Delivery {
        host_path: Some(host.to_path_buf()),
        written: false,
        note: String::new(),
    };
    let mut f = match open_below(root, host) {
        Ok(f) => f,
        Err(e) => {
            outcome.note = format!("not written: {e}");
            return outcome;
        }
    };
    let mut existing = Vec::new();
    if let Err(e) = (&mut f)
        .take(KUBELET_LIMIT as u64 + 1)
        .read_to_end(&mut existing)
    {
        outcome.note = format!("not written: cannot read {}: {e}", host.display());
        return outcome;
    }
    // A second poststop (runtimes may call it twice) must not append the same line again.
    if let Some(first) = lines.first() {
        if String::from_utf8_lossy(&existing).contains(first.as_str()) {
            outcome.written = true;
            outcome.note = "already written".into();
            return outcome;
        }
    }
    let size = f
        .metadata()
        .map(|m| m.len() as usize)
        .unwrap_or(existing.len());
    let ends_in_newline = existing.last() == Some(&b'\n');
    let Some(text) = text_to_append(size, ends_in_newline, lines) else {
        outcome.note = format!(
            "not written: the application's message already fills kubelet's {KUBELET_LIMIT} bytes"
        );
        return outcome;
    };
    match f.write_all(text.as_bytes()).and_then(|_| f.sync_all()) {
        Ok(()) => {
            outcome.written = true;
            outcome.note = format!("appended {} bytes", text.len());
        }
        Err(e) => outcome.note = format!("not written: cannot append to {}: {e}", host.display()),
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn trims_our_text_never_the_apps() {
        let line = vec![
            "devgate: DeviceFault/XID79 on /dev/nvidia1 (GPU-1): GPU has fallen off the bus"
                .to_string(),
        ];
        assert_eq!(
            text_to_append(0, false, &line).unwrap(),
            format!("{}\n", line[0])
        );
        assert_eq!(
            text_to_append(5, false, &line).unwrap(),
            format!("\n{}\n", line[0])
        );
        assert_eq!(
            text_to_append(5, true, &line).unwrap(),
            format!("{}\n", line[0])
        );
        let t = text_to_append(KUBELET_LIMIT - 40, false, &line).unwrap();
        assert_eq!(t.len(), 40);
        assert!(t.starts_with("\ndevgate: DeviceFault/XID79"));
        assert!(text_to_append(KUBELET_LIMIT - 10, false, &line).is_none());
        assert!(text_to_append(KUBELET_LIMIT, true, &line).is_none());
        assert!(text_to_append(KUBELET_LIMIT + 100, true, &line).is_none());
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
        let o = append(&root, &c.join("link"), &["x".into()]);
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
        assert!(e.contains("disagree"), "{e}");
    }
}
