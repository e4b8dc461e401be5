//! What [`check_path`](super::check_path) found of each directory on its way, remembered
//! for the short run of [`dirs_checked_once`].

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A directory's path (its bytes), owner and mode.
type Judged = (Box<[u8]>, u32, u32);

thread_local! {
    /// The directories [`check_path`](super::check_path) judged inside
    /// [`dirs_checked_once`], each with the owner and mode its lstat gave; None outside it.
    /// Paths are compared as bytes (the walk spells each prefix the same way every time),
    /// not component by component as `Path`'s `==` does.
    static CHECKED: std::cell::RefCell<Option<Vec<Judged>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with each directory [`check_path`](super::check_path) finds on its way
/// stat'ed once: a later check in `f` that passes through it (a decision's record and then its log line, whose paths
/// share `/`, `/run`, ...) judges the owner and mode the first lstat gave instead of
/// making it again. Sound for the short run of `f` because a directory the walk judged
/// can be changed by nobody but root (or devgate's own user) from then on: its owner is
/// root's or ours, so only we can chmod or chown it; it cannot be renamed or replaced,
/// since that needs write access to its parent, which the same walk found to be ours and
/// writable by no one else, or sticky (where nobody else can rename our entries); and so
/// on up to `/`. A fresh lstat can only differ if root changed the path in between, which
/// the check cannot stop anyway (root could change it just after). Only directories are
/// remembered: a symlink on the way is read and its target walked again every time, and
/// an absent directory is looked for again. Each use is judged again with its own rule
/// (the directory at the end may not be sticky and open, as an ancestor may). Outside
/// `f` nothing is remembered; nested calls share the outer one's memo.
pub fn dirs_checked_once<T>(f: impl FnOnce() -> T) -> T {
    struct Forget;
    impl Drop for Forget {
        fn drop(&mut self) {
            CHECKED.with(|c| *c.borrow_mut() = None);
        }
    }
    if CHECKED.with(|c| c.borrow().is_some()) {
        return f();
    }
    CHECKED.with(|c| *c.borrow_mut() = Some(Vec::with_capacity(16)));
    let _forget = Forget;
    f()
}

/// The owner and mode [`dirs_checked_once`] remembers for `dir`.
pub(super) fn checked_before(dir: &Path) -> Option<(u32, u32)> {
    CHECKED.with(|c| {
        c.borrow()
            .as_ref()?
            .iter()
            .find(|(p, _, _)| **p == *dir.as_os_str().as_bytes())
            .map(|&(_, uid, mode)| (uid, mode))
    })
}

pub(super) fn remember_checked(dir: &Path, uid: u32, mode: u32) {
    CHECKED.with(|c| {
        if let Some(seen) = c.borrow_mut().as_mut() {
            seen.push((dir.as_os_str().as_bytes().into(), uid, mode));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsutil::tests::tempdir;
    use crate::fsutil::{check_path, DirState};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// Inside `dirs_checked_once` a directory is stat'ed once: a later check judges what the
    /// first lstat gave (shown here by a change only root or the owner can make, which it
    /// does not see), by the rule for its place in the path (open and sticky passes on the
    /// way, never at the end). Outside, and after, every check stats again.
    #[test]
    fn inside_dirs_checked_once_each_directory_is_stated_once() {
        let d = tempdir("dir-memo");
        fs::create_dir_all(d.join("sticky/state")).unwrap();
        fs::set_permissions(d.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
        let state = d.join("sticky/state");
        dirs_checked_once(|| {
            assert_eq!(check_path(&state).unwrap(), DirState::Present);
            assert!(checked_before(&d.join("sticky")).is_some());
            let e = check_path(&d.join("sticky")).unwrap_err().to_string();
            assert!(e.contains("writable by group or others (mode 1777)"), "{e}");
            fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
            assert_eq!(check_path(&state).unwrap(), DirState::Present);
            // nested: the same memo
            dirs_checked_once(|| assert_eq!(check_path(&state).unwrap(), DirState::Present));
            assert!(checked_before(&state).is_some(), "a nested call forgot");
        });
        assert_eq!(checked_before(&state), None);
        let e = check_path(&state).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 777)"), "{e}");
        // a directory that failed its check is not remembered, nor anything outside
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
        dirs_checked_once(|| {
            assert!(check_path(&d.join("sticky")).is_err());
            assert_eq!(checked_before(&d.join("sticky")), None);
        });
        fs::remove_dir_all(&d).unwrap();
    }
}
