//! The v1 devices controller: `TYPE MAJ:MIN ACCESS` written to devices.deny and
//! devices.allow, checked afterwards against devices.list.

use super::error::{ListRule, RuleError};
use crate::error::{Error, Result};
use crate::fsutil::read_bounded;
use crate::model::device::{DevNum, DevType};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub fn rule(num: DevNum, access: &str) -> String {
    format!("{} {}:{} {access}", num.typ.letter(), num.major, num.minor)
}

fn write_file(dir: &Path, file: &str, line: &str) -> Result<()> {
    let path = dir.join(file);
    let mut f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io("cannot open", &path, e))?;
    f.write_all(line.as_bytes())
        .map_err(|e| Error::io(format!("cannot write {line:?} to"), &path, e))
}

/// One devices.list entry; `None` is the `*` wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub typ: Option<DevType>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: String,
}

impl ListEntry {
    fn covers(&self, n: DevNum) -> bool {
        self.typ.map_or(true, |t| t == n.typ)
            && self.major.map_or(true, |m| m == n.major)
            && self.minor.map_or(true, |m| m == n.minor)
    }
}

pub fn parse_list(text: &str) -> Vec<ListEntry> {
    let num = |s: &str| -> Option<Option<u32>> {
        if s == "*" {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let typ = match it.next()? {
                "a" => None,
                "c" => Some(DevType::Char),
                "b" => Some(DevType::Block),
                _ => return None,
            };
            let (ma, mi) = it.next()?.split_once(':')?;
            Some(ListEntry {
                typ,
                major: num(ma)?,
                minor: num(mi)?,
                access: it.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// What devices.list says about the change; `Err` says what is still wrong.
pub fn check_list(
    entries: &[ListEntry],
    bad: DevNum,
    spare: DevNum,
) -> std::result::Result<(), RuleError> {
    // A default-allow cgroup lists only `a *:* rwm` and hides its deny exceptions; the
    // kernel accepted the deny write, which is all there is to see.
    let allow_all = entries.len() == 1
        && entries[0].typ.is_none()
        && entries[0].major.is_none()
        && entries[0].minor.is_none();
    if allow_all {
        return Ok(());
    }
    // `c *:* m` (every runtime's default) lets mknod through; opening is what matters.
    let opens =
        |e: &&ListEntry| e.covers(bad) && (e.access.contains('r') || e.access.contains('w'));
    if let Some(e) = entries.iter().find(opens) {
        return Err(RuleError::StillAllowed {
            bad,
            rule: ListRule {
                typ: e.typ,
                major: e.major,
                minor: e.minor,
                access: e.access.clone(),
            },
        });
    }
    let rw = |e: &&ListEntry| e.covers(spare) && e.access.contains('r') && e.access.contains('w');
    if !entries.iter().any(|e| rw(&e)) {
        return Err(RuleError::SpareNotAllowed { spare });
    }
    Ok(())
}

pub fn read_list(dir: &Path) -> Result<Vec<ListEntry>> {
    let path = dir.join("devices.list");
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io("cannot open", &path, e))?;
    let b = read_bounded(f, 1 << 20, "cgroup file", &path)?;
    Ok(parse_list(&String::from_utf8_lossy(&b)))
}

/// Denies `bad` and allows `spare` (rwm) in the devices cgroup at `dir`, then checks
/// devices.list. The deny goes first: between the two writes the container can reach
/// neither, never both.
pub fn remap(dir: &Path, bad: DevNum, spare: DevNum) -> Result<()> {
    write_file(dir, "devices.deny", &rule(bad, "rwm"))?;
    write_file(dir, "devices.allow", &rule(spare, "rwm"))?;
    let entries = read_list(dir)?;
    check_list(&entries, bad, spare).map_err(|m| {
        Error::invalid(
            format!("devices cgroup {}", dir.join("devices.list").display()),
            m.to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: DevNum = DevNum {
        typ: DevType::Char,
        major: 1,
        minor: 5,
    };
    const FULL: DevNum = DevNum {
        typ: DevType::Char,
        major: 1,
        minor: 7,
    };

    #[test]
    fn list_check_sees_wildcards_and_missing_allow() {
        let ok = parse_list("c *:* m\nb *:* m\nc 1:3 rwm\nc 1:7 rwm\nc 136:* rwm\n");
        assert_eq!(check_list(&ok, ZERO, FULL), Ok(()));
        let e = check_list(&parse_list("c 1:* rwm\nc 1:7 rwm\n"), ZERO, FULL).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c 1:5 is still allowed by the rule c 1:* rwm"
        );
        let e = check_list(&parse_list("c 1:7 r\n"), ZERO, FULL).unwrap_err();
        assert_eq!(e, RuleError::SpareNotAllowed { spare: FULL });
        assert_eq!(e.to_string(), "c 1:7 is not allowed for read and write");
        assert_eq!(check_list(&parse_list("a *:* rwm\n"), ZERO, FULL), Ok(()));
        let e = check_list(&parse_list("c *:* rw\nc 1:7 rwm\n"), ZERO, FULL).unwrap_err();
        assert!(e.to_string().contains("rule c *:* rw"), "{e}");
    }

    #[test]
    fn real_v1_cgroup_deny_and_allow() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let root = Path::new("/sys/fs/cgroup/devices");
        if !root.join("devices.allow").exists() {
            eprintln!(
                "skipped: no v1 devices controller mounted at {}",
                root.display()
            );
            return;
        }
        let dir = root.join(format!("devgate-unit-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let res = (|| -> Result<Vec<ListEntry>> {
            write_file(&dir, "devices.deny", "a")?;
            write_file(&dir, "devices.allow", "c 1:5 rwm")?;
            remap(&dir, ZERO, FULL)?;
            read_list(&dir)
        })();
        let _ = std::fs::remove_dir(&dir);
        let list = res.unwrap();
        assert!(!list.iter().any(|e| e.covers(ZERO)), "{list:?}");
        assert!(
            list.iter().any(|e| e.covers(FULL) && e.access == "rwm"),
            "{list:?}"
        );
    }
}
