//! Running a host's own program inside the host root the installer is given (`--root`),
//! as the DaemonSet does from its pod: the host's systemctl, the host's containerd.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Makes `cmd` run inside `root` (chroot, then `/` as its directory), where `root` is not
/// already `/`; its program and arguments are then paths as the host names them.
pub(crate) fn run_inside(cmd: &mut Command, root: &Path) -> Result<(), String> {
    if root == Path::new("/") {
        return Ok(());
    }
    let dir = CString::new(root.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} holds a NUL byte", root.display()))?;
    // SAFETY: chroot and chdir are async-signal-safe; the path was made before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(dir.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}
