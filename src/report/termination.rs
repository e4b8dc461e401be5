//! The container's termination-message file, where kubelet looks for why a container
//! ended. devgate appends its fault line after what the application wrote, only to a
//! regular file below kubelet_pods_dir reached without any symlink, and never past the
//! 4096 bytes kubelet reads.

use crate::error::{Error, Result};
use crate::oci::spec::Spec;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// kubelet reads at most this much of the file (MaxContainerTerminationMessageLength).
pub const KUBELET_LIMIT: usize = 4096;
pub const PATH_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePath";
pub const DEFAULT_PATH: &str = "/dev/termination-log";

/// What happened to the termination message, for the exit record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delivery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<PathBuf>,
    pub written: bool,
    pub note: String,
}

/// The host file behind the container's termination-message path: the source of the bind
/// mount whose destination is that path.
pub fn host_file(spec: &Spec, state_annotations: &BTreeMap<String, String>) -> Option<PathBuf> {
    let dest = spec
        .annotation(state_annotations, PATH_ANNOTATION)
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_PATH);
    spec.mounts
        .iter()
        .rev()
        .find(|m| m.destination == Path::new(dest) && m.is_bind())
        .and_then(|m| m.source.clone())
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

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("termination message path", "contains a NUL byte"))
}

fn openat(dir: libc::c_int, name: &Path, flags: libc::c_int, what: &Path) -> Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid NUL-terminated path and flags; the fd is owned on success.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Error::io(
            "cannot open",
            what,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fd was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` for appending when it is a regular file below `root`, walking every
/// component under `root` with O_NOFOLLOW. `root` itself is the operator's configuration
/// and may be a symlink (kubelet's directory often is).
///
/// Long because it walks the path one component at a time with openat, refusing
/// symlinks at each step; the steps share the directory fd.
pub fn open_below(root: &Path, path: &Path) -> Result<File> {
    let rel = path.strip_prefix(root).map_err(|_| {
        Error::unsafe_path(
            path,
            format!("not below kubelet_pods_dir {}", root.display()),
        )
    })?;
    let comps: Vec<&Path> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(Path::new(n)),
            _ => Err(Error::unsafe_path(path, "has a '..' or '.' component")),
        })
        .collect::<Result<_>>()?;
    let Some((last, dirs)) = comps.split_last() else {
        return Err(Error::unsafe_path(path, "is kubelet_pods_dir itself"));
    };
    let mut dir = openat(libc::AT_FDCWD, root, libc::O_PATH | libc::O_DIRECTORY, root)?;
    for c in dirs {
        dir = openat(
            std::os::fd::AsRawFd::as_raw_fd(&dir),
            c,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            path,
        )
        .map_err(|e| match e {
            Error::Io { source, .. }
                if source.raw_os_error() == Some(libc::ENOTDIR)
                    || source.raw_os_error() == Some(libc::ELOOP) =>
            {
                Error::unsafe_path(
                    path,
                    format!("component {} is a symlink or not a directory", c.display()),
                )
            }
            e => e,
        })?;
    }
    let leaf = openat(
        std::os::fd::AsRawFd::as_raw_fd(&dir),
        last,
        libc::O_PATH | libc::O_NOFOLLOW,
        path,
    )?;
    let leaf = File::from(leaf);
    let meta = leaf
        .metadata()
        .map_err(|e| Error::io("cannot stat", path, e))?;
    if meta.file_type().is_symlink() {
        return Err(Error::unsafe_path(path, "is a symlink"));
    }
    if !meta.is_file() {
        return Err(Error::unsafe_path(path, "is not a regular file"));
    }
    // Reopen the very inode we checked, for writing; O_PATH fds cannot write.
    let proc_path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&leaf)
    ));
    std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(&proc_path)
        .map_err(|e| Error::io("cannot open for append", path, e))
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
        let d = std::env::temp_dir().join(format!("devgate-term-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
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
            (c.join("link"), "is a symlink"),
            (
                root.join("uid/dirlink/log"),
                "is a symlink or not a directory",
            ),
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
}
