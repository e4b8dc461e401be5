//! cgroup v2 device policy: the BPF_PROG_TYPE_CGROUP_DEVICE programs attached to a
//! cgroup. Several attached programs (BPF_F_ALLOW_MULTI) are ANDed, so an allow must be in
//! every one of them. A remap is composed, never rebuilt from the spec: other hooks may
//! have extended the runtime's program (NVIDIA's legacy hook prepends its GPU allow rules
//! to each), and what they added must stay. For every attached program devgate reads its
//! instructions back (BPF_OBJ_GET_INFO_BY_FD), puts deny-bad and allow-spare in front, loads
//! the result and swaps it in with BPF_F_REPLACE, in place. Where the kernel has no
//! BPF_F_REPLACE (before 5.6) the new program is attached beside the old, which is then
//! detached: both run between the two steps, which can only deny more, never allow, and
//! the cgroup is never without a filter.
//! Raw bpf(2) through libc; no library, nothing loaded from a file.

use super::bpf;
use super::error::ProgramError;
use crate::error::{Error, Result};
use crate::model::device::DevNum;
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
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
pub const BPF_F_ALLOW_MULTI: u32 = 2;
pub const BPF_F_REPLACE: u32 = 4;
const MAX_PROGS: usize = 64;
/// A device program longer than this is not a device filter devgate will copy.
const MAX_INSNS: u32 = 1 << 16;
/// Attempts at a remap when another writer (a runtime's update) swaps programs meanwhile.
const ATTEMPTS: usize = 5;

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

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
    _rest: [u64; 8],
}

/// The head of `struct bpf_prog_info`; the kernel fills no more than `info_len` bytes.
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
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

/// How often a load the kernel answered with EAGAIN is tried again. The
/// verifier gives up with EAGAIN when a signal is pending (`do_check`), which
/// says nothing about the program; libbpf and cilium/ebpf (runc) retry too.
const LOAD_ATTEMPTS: usize = 5;

/// Loads a device program; the verifier's complaint, if any, is in the error.
pub fn load(prog: &[bpf::Insn]) -> std::result::Result<OwnedFd, ProgramError> {
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
        retry_interrupted(|| sys_bpf(BPF_PROG_LOAD, &mut a))
    };
    // The first try goes without a log: the verifier is slower writing one.
    let e = match attempt(false) {
        Ok(fd) => return Ok(owned(fd)),
        Err(e) => e,
    };
    if let Ok(fd) = attempt(true) {
        return Ok(owned(fd));
    }
    let text = String::from_utf8_lossy(&log);
    let text = text.trim_end_matches('\0').trim();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    Err(ProgramError::Load {
        insns: insns.len(),
        source: e.into(),
        verifier: (!tail.is_empty())
            .then(|| tail.into_iter().rev().collect::<Vec<_>>().join(" / ")),
    })
}

/// Calls `f` again while it fails with EAGAIN, at most LOAD_ATTEMPTS times.
fn retry_interrupted<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut left = LOAD_ATTEMPTS;
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && left > 1 => left -= 1,
            r => return r,
        }
    }
}

fn attach(cg: &File, prog: &OwnedFd, flags: u32, replace: Option<&OwnedFd>) -> io::Result<()> {
    let mut a = AttachAttr {
        target_fd: cg.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: flags,
        ..Default::default()
    };
    if let Some(old) = replace {
        a.attach_flags |= BPF_F_REPLACE;
        a.replace_bpf_fd = old.as_raw_fd() as u32;
    }
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

pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut a = GetFdAttr {
        prog_id: id,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map(owned)
}

fn prog_info(fd: &OwnedFd, info: &mut ProgInfo) -> io::Result<()> {
    let mut a = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfo>() as u32,
        info: info as *mut ProgInfo as u64,
        ..Default::default()
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a).map(|_| ())
}

/// A program's id.
fn prog_id(fd: &OwnedFd) -> io::Result<u32> {
    let mut info = ProgInfo::default();
    prog_info(fd, &mut info)?;
    Ok(info.id)
}

/// A program's instructions as the kernel keeps them (after verification), if they can be
/// copied into a new program as they are.
pub fn instructions(fd: &OwnedFd) -> std::result::Result<Vec<bpf::Insn>, ProgramError> {
    let mut info = ProgInfo::default();
    prog_info(fd, &mut info).map_err(|e| ProgramError::Info(e.into()))?;
    if info.nr_map_ids != 0 {
        return Err(ProgramError::UsesMaps(info.nr_map_ids));
    }
    let n = info.xlated_prog_len / 8;
    if n == 0 || n > MAX_INSNS {
        return Err(ProgramError::InstructionBytes(info.xlated_prog_len));
    }
    let mut raw = vec![0u64; n as usize];
    let mut again = ProgInfo {
        xlated_prog_len: n * 8,
        xlated_prog_insns: raw.as_mut_ptr() as u64,
        ..Default::default()
    };
    prog_info(fd, &mut again).map_err(|e| ProgramError::Info(e.into()))?;
    if again.xlated_prog_len != n * 8 {
        return Err(ProgramError::InstructionsChanged);
    }
    let prog = bpf::decode(&raw);
    match bpf::not_copyable(&prog) {
        Some(why) => Err(why),
        None => Ok(prog),
    }
}

/// What a remap did to a cgroup's device programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composed {
    /// The programs attached before, in the kernel's order.
    pub old: Vec<u32>,
    /// The programs attached now.
    pub new: Vec<u32>,
    /// "replaced in place", "attached, then the old detached", or "attached (none was)".
    pub how: &'static str,
}

/// One attempt; `Ok(None)` when an attached program went away meanwhile (a runtime's
/// update raced this one), which is worth another attempt.
/// Long because the three ways to attach (none was, BPF_F_REPLACE in place, attach beside
/// then detach) work on the one query's programs, opened once above them; side by side,
/// the retries (`Ok(None)`) and errors of each stay in view.
fn compose_once(
    cg: &File,
    dir: &Path,
    prefix: &[bpf::Insn],
    use_replace: &mut bool,
) -> Result<Option<Composed>> {
    let (old, flags) = query_fd(cg, dir)?;
    let ctx = || format!("cgroup {}", dir.display());
    if old.is_empty() {
        // No program: the container may open any device; allow all but the bad one.
        let fd =
            load(&bpf::compose(prefix, None)).map_err(|m| Error::invalid(ctx(), m.to_string()))?;
        attach(cg, &fd, BPF_F_ALLOW_MULTI, None).map_err(|e| {
            Error::io(
                "cannot attach a device program (BPF_F_ALLOW_MULTI) to",
                dir,
                e,
            )
        })?;
        let id = prog_id(&fd).map_err(|e| Error::io("cannot read the new program of", dir, e))?;
        return Ok(Some(Composed {
            old,
            new: vec![id],
            how: "attached (none was)",
        }));
    }
    let mut olds = Vec::new();
    for id in &old {
        let fd = match prog_fd_by_id(*id) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => {
                return Err(Error::io(
                    format!("cannot open attached device program {id} of"),
                    dir,
                    e,
                ))
            }
        };
        let insns = instructions(&fd).map_err(|m| {
            Error::invalid(
                ctx(),
                format!("attached device program {id} cannot be extended: {m}"),
            )
        })?;
        let new = load(&bpf::compose(prefix, Some(&insns)))
            .map_err(|m| Error::invalid(ctx(), format!("program {id} extended: {m}")))?;
        olds.push((*id, fd, new));
    }
    let multi = flags & BPF_F_ALLOW_MULTI != 0;
    let mut new_ids = Vec::new();
    let mut how = "replaced in place";
    if multi && *use_replace {
        for (id, fd, new) in &olds {
            match attach(cg, new, BPF_F_ALLOW_MULTI, Some(fd)) {
                Ok(()) => {}
                // The old one was swapped by someone else meanwhile: query again. What was
                // already replaced here keeps its prefix; a second prefix is harmless.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
                // No BPF_F_REPLACE in this kernel: attach beside, then detach.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && new_ids.is_empty() => {
                    *use_replace = false;
                    return Ok(None);
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("cannot replace device program {id} (BPF_F_REPLACE) of"),
                        dir,
                        e,
                    ))
                }
            }
            new_ids.push(
                prog_id(new).map_err(|e| Error::io("cannot read the new program of", dir, e))?,
            );
        }
    } else if multi {
        how = "attached, then the old detached";
        for (_, _, new) in &olds {
            attach(cg, new, BPF_F_ALLOW_MULTI, None).map_err(|e| {
                Error::io(
                    "cannot attach a device program (BPF_F_ALLOW_MULTI) to",
                    dir,
                    e,
                )
            })?;
            new_ids.push(
                prog_id(new).map_err(|e| Error::io("cannot read the new program of", dir, e))?,
            );
        }
        for (id, fd, _) in &olds {
            match detach(cg, fd) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("cannot detach the old device program {id} from"),
                        dir,
                        e,
                    ))
                }
            }
        }
    } else {
        // One program attached without ALLOW_MULTI: attaching with the same flags replaces
        // it in place.
        let (id, _, new) = &olds[0];
        attach(cg, new, flags, None)
            .map_err(|e| Error::io(format!("cannot replace device program {id} of"), dir, e))?;
        new_ids
            .push(prog_id(new).map_err(|e| Error::io("cannot read the new program of", dir, e))?);
    }
    Ok(Some(Composed {
        old,
        new: new_ids,
        how,
    }))
}

/// Puts "deny `bad`, allow `spare`" in front of every device program attached to the
/// cgroup at `dir` (or attaches one that denies only `bad` where none is), then checks that
/// exactly the new programs are attached. On a failure part-way, what is attached is never
/// more permissive than before for anything but the spare.
pub fn remap(dir: &Path, bad: DevNum, spare: DevNum) -> Result<Composed> {
    let prefix = bpf::remap_prefix(&[bad], &[spare]);
    let cg = open_cgroup(dir)?;
    let mut use_replace = true;
    for _ in 0..ATTEMPTS {
        let Some(done) = compose_once(&cg, dir, &prefix, &mut use_replace)? else {
            continue;
        };
        let (now, _) = query_fd(&cg, dir)?;
        let mut want = done.new.clone();
        let mut got = now.clone();
        want.sort_unstable();
        got.sort_unstable();
        if want != got {
            return Err(Error::invalid(
                format!("cgroup {}", dir.display()),
                format!(
                    "after extending device programs {:?} the cgroup has {now:?}, expected {:?}",
                    done.old, done.new
                ),
            ));
        }
        return Ok(done);
    }
    Err(Error::invalid(
        format!("cgroup {}", dir.display()),
        format!("its device programs kept changing; gave up after {ATTEMPTS} attempts"),
    ))
}

/// Attaches a program built from `rules` beside whatever is there: a runtime's own attach,
/// for tests and benchmarks.
pub fn attach_new(dir: &Path, rules: &[LinuxDeviceCgroup]) -> Result<()> {
    let prog = bpf::program(rules).map_err(|m| Error::invalid("device rules", m.to_string()))?;
    let cg = open_cgroup(dir)?;
    let fd = load(&prog)
        .map_err(|m| Error::invalid(format!("cgroup {}", dir.display()), m.to_string()))?;
    attach(&cg, &fd, BPF_F_ALLOW_MULTI, None).map_err(|e| {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counting(fails: usize, errno: i32) -> (usize, io::Result<i64>) {
        let mut calls = 0;
        let r = retry_interrupted(|| {
            calls += 1;
            if calls <= fails {
                Err(io::Error::from_raw_os_error(errno))
            } else {
                Ok(7)
            }
        });
        (calls, r)
    }

    #[test]
    fn an_interrupted_load_is_tried_again() {
        let (calls, r) = counting(LOAD_ATTEMPTS - 1, libc::EAGAIN);
        assert_eq!((calls, r.unwrap()), (LOAD_ATTEMPTS, 7));
    }

    #[test]
    fn retries_are_bounded_and_other_errors_are_not_retried() {
        let (calls, r) = counting(usize::MAX, libc::EAGAIN);
        assert_eq!(calls, LOAD_ATTEMPTS);
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
        let (calls, r) = counting(usize::MAX, libc::EINVAL);
        assert_eq!(calls, 1);
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }
}
