//! The cgroup a runtime puts a container in, derived from the spec's `linux.cgroupsPath` as
//! runc and crun derive it, so that the cgroup a pid is in can be checked against it before
//! anything is edited: a pid that died and was reused is in some other cgroup.
//!
//! - cgroupfs driver: an absolute path is taken from the hierarchy's root; a relative one
//!   (and, with no cgroupsPath at all, the container id) is put below the runtime's own
//!   cgroup, which devgate does not know, so only the tail is compared.
//! - systemd driver: `slice:prefix:name`, e.g. `kubepods-besteffort-pod123.slice:cri-containerd:abc`
//!   is `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope`.

use super::error::{LocateError, SpecPlace};

/// One place the spec allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The whole path from the hierarchy's root.
    Exact(String),
    /// The last components of the path (below the runtime's own cgroup).
    Tail(String),
    /// A last component `PREFIX-ID.scope`: a runtime's systemd default with no cgroupsPath.
    Scope(String),
}

impl Expected {
    fn matches(&self, actual: &[&str]) -> bool {
        match self {
            Expected::Exact(p) => components(p).is_some_and(|c| c == actual),
            Expected::Tail(p) => {
                components(p).is_some_and(|c| !c.is_empty() && actual.ends_with(&c))
            }
            Expected::Scope(id) => actual.last().is_some_and(|l| {
                l.strip_suffix(".scope")
                    .and_then(|s| s.strip_suffix(id.as_str()))
                    .is_some_and(|p| p.ends_with('-'))
            }),
        }
    }
}

/// The plain names of a cgroup path; `None` for `..` (never a path a runtime makes).
fn components(p: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// systemd's path for a slice: every `-` opens a parent slice. `-.slice` is the root.
pub fn expand_slice(slice: &str) -> Option<String> {
    if slice == "-.slice" {
        return Some(String::new());
    }
    let name = slice.strip_suffix(".slice")?;
    if name.is_empty()
        || name.contains('/')
        || name.starts_with('-')
        || name.ends_with('-')
        || name.contains("--")
    {
        return None;
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
        prefix.push('-');
    }
    Some(path)
}

/// The cgroup paths a systemd-driver `slice:prefix:name` stands for (runc 1.1 names a unit
/// with an empty prefix `-name.scope`, later runtimes `name.scope`).
pub fn systemd_paths(cgroups_path: &str) -> Vec<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let [slice, prefix, name] = parts[..] else {
        return Vec::new();
    };
    if name.is_empty() || name.contains('/') || prefix.contains('/') {
        return Vec::new();
    }
    let Some(base) = expand_slice(if slice.is_empty() {
        "system.slice"
    } else {
        slice
    }) else {
        return Vec::new();
    };
    let units = if name.ends_with(".slice") {
        vec![name.to_string()]
    } else if prefix.is_empty() {
        vec![format!("-{name}.scope"), format!("{name}.scope")]
    } else {
        vec![format!("{prefix}-{name}.scope")]
    };
    units.into_iter().map(|u| format!("{base}/{u}")).collect()
}

/// Every place the spec's cgroupsPath (or its absence) allows for container `id`.
pub fn expected(cgroups_path: Option<&str>, id: &str) -> Vec<Expected> {
    let Some(p) = cgroups_path.filter(|p| !p.is_empty()) else {
        return vec![
            Expected::Tail(id.to_string()),
            Expected::Scope(id.to_string()),
        ];
    };
    let mut out: Vec<Expected> = systemd_paths(p).into_iter().map(Expected::Exact).collect();
    if p.starts_with('/') {
        out.push(Expected::Exact(p.to_string()));
    } else if out.is_empty() {
        out.push(Expected::Tail(p.to_string()));
    }
    out
}

/// Whether `actual` (a path from /proc/PID/cgroup) is where the spec puts the container;
/// `Err` says what was expected, in one clause.
pub fn check(actual: &str, cgroups_path: Option<&str>, id: &str) -> Result<(), LocateError> {
    let Some(parts) = components(actual) else {
        return Err(LocateError::DotDot {
            cgroup: actual.to_string(),
        });
    };
    if expected(cgroups_path, id).iter().any(|e| e.matches(&parts)) {
        return Ok(());
    }
    let spec = match cgroups_path.filter(|p| !p.is_empty()) {
        Some(p) => SpecPlace::CgroupsPath {
            path: p.to_string(),
            systemd: systemd_paths(p),
        },
        None => SpecPlace::NoPath { id: id.to_string() },
    };
    Err(LocateError::Misplaced {
        cgroup: actual.to_string(),
        spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_expand_like_systemd() {
        assert_eq!(
            expand_slice("kubepods-besteffort-pod123.slice").as_deref(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice")
        );
        assert_eq!(
            expand_slice("system.slice").as_deref(),
            Some("/system.slice")
        );
        assert_eq!(expand_slice("-.slice").as_deref(), Some(""));
        for bad in [
            "",
            "x",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "a/b.slice",
            ".slice",
        ] {
            assert_eq!(expand_slice(bad), None, "{bad}");
        }
    }

    #[test]
    fn systemd_form_expands_to_the_scope() {
        assert_eq!(
            systemd_paths("kubepods-besteffort-pod123.slice:cri-containerd:abc"),
            vec!["/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope"]
        );
        assert_eq!(
            systemd_paths(":crio:abc"),
            vec!["/system.slice/crio-abc.scope"]
        );
        assert_eq!(
            systemd_paths("machine.slice::abc"),
            vec!["/machine.slice/-abc.scope", "/machine.slice/abc.scope"]
        );
        assert_eq!(
            systemd_paths("user.slice:x:my.slice"),
            vec!["/user.slice/my.slice"]
        );
        assert!(systemd_paths("/a/b").is_empty());
        assert!(systemd_paths("a:b").is_empty());
        assert!(systemd_paths("bad:p:n").is_empty());
    }

    #[test]
    fn check_accepts_what_runtimes_make() {
        let sd = "kubepods-besteffort-pod123.slice:cri-containerd:abc";
        let full = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope";
        assert_eq!(check(full, Some(sd), "abc"), Ok(()));
        // cgroupfs: absolute is exact, relative is below the runtime's own cgroup
        assert_eq!(
            check("/kubepods/pod1/abc", Some("/kubepods/pod1/abc"), "abc"),
            Ok(())
        );
        assert_eq!(
            check("/kubepods/pod1/abc", Some("kubepods//pod1/abc/"), "x"),
            Ok(())
        );
        assert_eq!(check("/runc-parent/t1", None, "t1"), Ok(()));
        assert_eq!(check("/t1", None, "t1"), Ok(()));
        assert_eq!(check("/t1", Some(""), "t1"), Ok(()));
        assert_eq!(check("/system.slice/runc-t1.scope", None, "t1"), Ok(()));
        assert_eq!(check("/machine.slice/libpod-t1.scope", None, "t1"), Ok(()));
    }

    #[test]
    fn check_refuses_another_cgroup_and_the_root() {
        let e = check("/", None, "t1").unwrap_err();
        assert_eq!(
            e,
            LocateError::Misplaced {
                cgroup: "/".into(),
                spec: SpecPlace::NoPath { id: "t1".into() }
            }
        );
        assert_eq!(
            e.to_string(),
            "the container's process is in cgroup \"/\", not where its spec puts it (no \
             cgroupsPath: a cgroup named after the container id \"t1\"); its pid may belong to \
             another process now"
        );
        assert!(check("/other/t12", None, "t1").is_err());
        assert!(check("/t1/child", None, "t1").is_err());
        assert!(check("/x/kubepods/pod1/abc", Some("/kubepods/pod1/abc"), "abc").is_err());
        assert!(check("/kubepods/pod1", Some("/kubepods/pod1/abc"), "abc").is_err());
        assert!(
            check("/", Some("/"), "abc").is_ok(),
            "the root check is the locator's"
        );
        let sd = "kubepods.slice:cri-containerd:abc";
        let e = check("/kubepods.slice/cri-containerd-abd.scope", Some(sd), "abc").unwrap_err();
        assert!(
            e.to_string()
                .contains("(cgroupsPath \"kubepods.slice:cri-containerd:abc\", that is /kubepods.slice/cri-containerd-abc.scope)"),
            "{e}"
        );
        assert!(check("/system.slice/runc-t1x.scope", None, "t1").is_err());
        assert_eq!(
            check("/a/../t1", None, "t1"),
            Err(LocateError::DotDot {
                cgroup: "/a/../t1".into()
            })
        );
        // a relative path never matches an empty tail
        assert!(check("/x", Some("."), "abc").is_err());
    }
}
