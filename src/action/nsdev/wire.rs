//! What the /dev edit's child and its parent share: the input prepared before fork, and
//! the fixed-size report the child writes to its pipe (plain integers, because the child
//! cannot allocate).

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

/// The child's last step: where it stopped, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(super) enum Step {
    Done = 0,
    Already,
    EnterNs,
    ProcRoot,
    Rootfs,
    Symlink,
    NotDir,
    Open,
    Stat,
    Missing,
    NotDev,
    Mismatch,
    PrivateDir,
    Mknod,
    NewNode,
    Chown,
    Verify,
    Rename,
}

impl Step {
    const ALL: [Step; 18] = [
        Step::Done,
        Step::Already,
        Step::EnterNs,
        Step::ProcRoot,
        Step::Rootfs,
        Step::Symlink,
        Step::NotDir,
        Step::Open,
        Step::Stat,
        Step::Missing,
        Step::NotDev,
        Step::Mismatch,
        Step::PrivateDir,
        Step::Mknod,
        Step::NewNode,
        Step::Chown,
        Step::Verify,
        Step::Rename,
    ];

    pub(super) fn from_code(c: i32) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as i32 == c)
    }
}

/// What the child writes to its pipe: plain integers, because the child cannot allocate.
/// The parent turns it into a `Step` and a `Found` at once.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub(super) struct Wire {
    pub(super) step: i32,
    pub(super) errno: i32,
    /// The path component the walk stopped at.
    pub(super) component: i32,
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) major: u32,
    pub(super) minor: u32,
}

/// What the child saw of the node.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found {
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) major: u32,
    pub(super) minor: u32,
}

/// Everything the child needs, prepared before fork.
pub(super) struct ChildInput<'a> {
    pub(super) pidfd: RawFd,
    pub(super) proc_root: RawFd,
    pub(super) out: RawFd,
    pub(super) rootfs: &'a CStr,
    pub(super) comps: &'a [CString],
    pub(super) private: &'a CStr,
    pub(super) expect: (libc::mode_t, u32, u32),
    pub(super) spare: (libc::mode_t, u32, u32),
}
