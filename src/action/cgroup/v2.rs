//! cgroup v2 device policy: the BPF_PROG_TYPE_CGROUP_DEVICE programs attached to a
//! cgroup. Several attached programs (BPF_F_ALLOW_MULTI) are ANDed, so adding an allow
//! takes a replacement: load the new program, attach it beside the old ones, then detach
//! those. Between the two steps both programs run, which can only deny more, never allow.
//! Raw bpf(2) through libc; no library, nothing loaded from a file.

use super::bpf;
use crate::error::{Error, Result};
use oci_spec::runtime::LinuxDeviceCgroup;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
pub const BPF_F_ALLOW_MULTI: u32 = 2;
const MAX_PROGS: usize = 64;

#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u64; 8],
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _pad: u32,
    _rest: [u64; 8],
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    _rest: [u64; 8],
}

#[repr(C)]
#[derive(Default)]
struct GetFdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
    _pad: u32,
    _rest: [u64; 8],
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: attr is a live, zero-padded repr(C) bpf_attr prefix of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

fn open_cgroup(dir: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| Error::io("cannot open cgroup", dir, e))
}

/// The device programs attached to a cgroup and the flags they were attached with.
#[cfg(test)]
pub fn query(dir: &Path) -> Result<(Vec<u32>, u32)> {
    let cg = open_cgroup(dir)?;
    query_fd(&cg, dir)
}

fn query_fd(cg: &File, dir: &Path) -> Result<(Vec<u32>, u32)> {
    let mut ids = vec![0u32; MAX_PROGS];
    let mut a = QueryAttr {
        target_fd: cg.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: MAX_PROGS as u32,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_QUERY, &mut a)
        .map_err(|e| Error::io("cannot query device programs (BPF_PROG_QUERY) of", dir, e))?;
    ids.truncate((a.prog_cnt as usize).min(MAX_PROGS));
    Ok((ids, a.attach_flags))
}

/// Loads a device program; the verifier's complaint, if any, is in the error.
pub fn load(prog: &[bpf::Insn]) -> std::result::Result<OwnedFd, String> {
    let insns = bpf::encode(prog);
    let license = b"Apache-2.0\0";
    let mut name = [0u8; 16];
    name[..7].copy_from_slice(b"devgate");
    let mut log = vec![0u8; 1 << 16];
    let mut attempt = |with_log: bool| {
        let mut a = LoadAttr {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            expected_attach_type: BPF_CGROUP_DEVICE,
            ..Default::default()
        };
        if with_log {
            a.log_level = 1;
            a.log_size = log.len() as u32;
            a.log_buf = log.as_mut_ptr() as u64;
        }
        sys_bpf(BPF_PROG_LOAD, &mut a)
    };
    match attempt(false) {
        Ok(fd) => Ok(owned(fd)),
        Err(e) => {
            let _ = attempt(true);
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            let mut msg = format!(
                "BPF_PROG_LOAD of a {}-instruction device program: {e}",
                insns.len()
            );
            if !tail.is_empty() {
                msg.push_str(": verifier: ");
                msg.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
            }
            Err(msg)
        }
    }
}

fn attach(cg: &File, prog: &OwnedFd, flags: u32) -> io::Result<()> {
    let mut a = AttachAttr {
        target_fd: cg.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: flags,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_ATTACH, &mut a).map(|_| ())
}

fn detach(cg: &File, prog: &OwnedFd) -> io::Result<()> {
    let mut a = AttachAttr {
        target_fd: cg.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_DETACH, &mut a).map(|_| ())
}

fn prog_fd(id: u32) -> io::Result<OwnedFd> {
    let mut a = GetFdAttr {
        prog_id: id,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map(owned)
}

/// What a replacement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    pub old: Vec<u32>,
    pub new: Vec<u32>,
}

/// Attaches a program built from `rules` to the cgroup at `dir`, replacing the device
/// programs attached there. On any failure after the attach the new program stays
/// attached beside the old (both must allow: never more access than either grants).
pub fn replace(dir: &Path, rules: &[LinuxDeviceCgroup]) -> Result<Replaced> {
    let prog = bpf::program(rules).map_err(|m| Error::invalid("device rules", m))?;
    let cg = open_cgroup(dir)?;
    let (old, flags) = query_fd(&cg, dir)?;
    let fd = load(&prog).map_err(|m| Error::invalid(format!("cgroup {}", dir.display()), m))?;
    let olds: Vec<OwnedFd> = old
        .iter()
        .map(|id| {
            prog_fd(*id).map_err(|e| {
                Error::io(
                    format!("cannot open attached device program {id} of"),
                    dir,
                    e,
                )
            })
        })
        .collect::<Result<_>>()?;
    if old.is_empty() || flags & BPF_F_ALLOW_MULTI != 0 {
        attach(&cg, &fd, BPF_F_ALLOW_MULTI).map_err(|e| {
            Error::io(
                "cannot attach device program (BPF_F_ALLOW_MULTI) to",
                dir,
                e,
            )
        })?;
        for (id, f) in old.iter().zip(&olds) {
            detach(&cg, f).map_err(|e| {
                Error::io(
                    format!("cannot detach the old device program {id} from"),
                    dir,
                    e,
                )
            })?;
        }
    } else {
        // Attached without ALLOW_MULTI: a second attach with the same flags replaces the
        // one program in place.
        attach(&cg, &fd, flags)
            .map_err(|e| Error::io("cannot attach device program to", dir, e))?;
    }
    let (new, _) = query_fd(&cg, dir)?;
    if new.len() != 1 || old.contains(&new[0]) {
        return Err(Error::invalid(
            format!("cgroup {}", dir.display()),
            format!("after replacing device programs {old:?} the cgroup has {new:?}"),
        ));
    }
    Ok(Replaced { old, new })
}

/// Attaches a program beside whatever is there, as a runtime does: the kernel tests'
/// starting point.
#[cfg(test)]
pub fn attach_new(dir: &Path, rules: &[LinuxDeviceCgroup]) -> Result<()> {
    let prog = bpf::program(rules).map_err(|m| Error::invalid("device rules", m))?;
    let cg = open_cgroup(dir)?;
    let fd = load(&prog).map_err(|m| Error::invalid(format!("cgroup {}", dir.display()), m))?;
    attach(&cg, &fd, BPF_F_ALLOW_MULTI).map_err(|e| {
        Error::io(
            "cannot attach device program (BPF_F_ALLOW_MULTI) to",
            dir,
            e,
        )
    })
}

#[cfg(test)]
#[path = "v2_kernel_tests.rs"]
mod kernel_tests;
