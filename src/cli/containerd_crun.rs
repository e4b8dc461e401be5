//! containerd's default runtime, where it runs crun, made to run devgate's runtime wrapper
//! (`install-host --enable`): the operator's `BinaryName` line is set aside (commented out
//! with [`WAS`]) and devgate's marked line follows it, so that uninstall-host's
//! [`disable`] gives the file back byte for byte.

use super::containerd_config::{
    disable, header_path, lookup, parse, quoted, runtime_path, version, Edit, EditError, MARK, WAS,
};
use std::path::Path;
use toml::Value;

type Result<T> = std::result::Result<T, EditError>;

/// `text` with the first `BinaryName = …` line of the `[path]` table set aside ([`WAS`]) and
/// `line`, marked, after it; None where the table has no such line of its own.
fn set_aside(text: &str, path: &[String], line: &str) -> Option<String> {
    let mut out = String::new();
    let mut in_table = false;
    let mut done = false;
    for l in text.split_inclusive('\n') {
        let t = l.trim_start();
        if t.starts_with('[') {
            in_table = header_path(l).as_deref() == Some(path);
        }
        let is_key = ["BinaryName", "\"BinaryName\"", "'BinaryName'"]
            .iter()
            .any(|k| {
                t.strip_prefix(k)
                    .is_some_and(|r| r.trim_start().starts_with('='))
            });
        if in_table && !done && is_key {
            let indent = &l[..l.len() - t.len()];
            out.push_str(WAS);
            out.push_str(l);
            if !l.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("{indent}{line} {MARK}\n"));
            done = true;
        } else {
            out.push_str(l);
        }
    }
    done.then_some(out)
}

/// `text` with the default runtime's `options.BinaryName`, where it is crun, set to
/// `wrapper`: the operator's line is set aside ([`WAS`]) and a marked one follows it.
/// Unchanged where the runtime does not run crun, or runs the wrapper already.
pub(super) fn wrap_crun(text: &str, wrapper: &Path) -> Result<Edit> {
    let before = parse(text)?;
    let v = version(&before)?;
    let mut path = runtime_path(&before, v)?;
    path.push("options".into());
    let key = |k: &str| format!("{}.{k}", path.join("."));
    let wrapper_s = wrapper.to_string_lossy();
    match lookup(&before, &path).and_then(|o| o.get("BinaryName")) {
        Some(Value::String(b)) if *b == wrapper_s => return Ok(Edit::Unchanged),
        Some(Value::String(b)) if Path::new(b).file_name().is_some_and(|n| n == "crun") => {}
        Some(Value::String(_)) | None => return Ok(Edit::Unchanged),
        Some(_) => {
            return Err(EditError::BadValue {
                key: key("BinaryName"),
            })
        }
    }
    let out = set_aside(text, &path, &format!("BinaryName = {}", quoted(&wrapper_s))).ok_or_else(
        || EditError::NoTable {
            table: path.join("."),
        },
    )?;
    // Checked: the wrapper is the runtime's binary, and removal gives `text` back.
    let after = parse(&out).map_err(|_| EditError::Unverified)?;
    let set = lookup(&after, &path)
        .and_then(|o| o.get("BinaryName"))
        .and_then(Value::as_str);
    let without = |t: &str| -> Result<String> {
        Ok(match disable(t)? {
            Edit::Changed(s) => s,
            Edit::Unchanged => t.to_string(),
        })
    };
    if set != Some(&wrapper_s) || without(&out)? != without(text)? {
        return Err(EditError::Unverified);
    }
    Ok(Edit::Changed(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::containerd_config::enable;

    const SPEC: &str = "/etc/containerd/devgate-base-spec.json";
    /// Debian's own config.toml (bookworm's and forky's containerd packages ship it).
    const DEBIAN: &str =
        "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    \
        [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

    /// A default runtime that runs crun: its BinaryName line is set aside for the wrapper's,
    /// and removal gives the file back byte for byte (containerd 1.6's version 2 and 2.x's
    /// version 3 alike).
    #[test]
    fn crun_binary_name_is_set_aside_for_the_wrapper() {
        let w = Path::new("/usr/local/bin/devgate-runtime");
        for (text, plugin) in [
            (
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun.options]\n    BinaryName = \"/usr/bin/crun\" # the operator's\n    SystemdCgroup = true\n",
                "io.containerd.grpc.v1.cri",
            ),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  'BinaryName' = 'crun'\n",
                "io.containerd.cri.v1.runtime",
            ),
        ] {
            let Edit::Changed(out) = wrap_crun(text, w).unwrap() else {
                panic!("unchanged: {text}");
            };
            let t = parse(&out).unwrap();
            let rt = if text.contains("runtimes.crun") { "crun" } else { "runc" };
            let opts = lookup(
                &t,
                &["plugins", plugin, "containerd", "runtimes", rt, "options"].map(String::from),
            )
            .unwrap();
            assert_eq!(opts["BinaryName"].as_str(), Some(w.to_str().unwrap()), "{out}");
            assert_eq!(disable(&out).unwrap(), Edit::Changed(text.to_string()));
            assert_eq!(wrap_crun(&out, w).unwrap(), Edit::Unchanged, "twice is once");
            // After devgate's base spec (as install-host edits), removal still gives the
            // text back.
            let Edit::Changed(spec_first) = enable(text, Path::new(SPEC)).unwrap() else {
                panic!("spec");
            };
            let Edit::Changed(wrapped) = wrap_crun(&spec_first, w).unwrap() else {
                panic!("wrap after spec");
            };
            assert_eq!(disable(&wrapped).unwrap(), Edit::Changed(text.to_string()));
            // With devgate's base spec too, removal still gives the text back.
            let Edit::Changed(both) = enable(&out, Path::new(SPEC)).unwrap() else {
                panic!("spec");
            };
            assert_eq!(disable(&both).unwrap(), Edit::Changed(text.to_string()));
        }
        // runc, or no BinaryName: nothing to wrap.
        assert_eq!(wrap_crun(DEBIAN, w).unwrap(), Edit::Unchanged);
        let runc = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  BinaryName = \"/usr/bin/runc\"\n";
        assert_eq!(wrap_crun(runc, w).unwrap(), Edit::Unchanged);
        // Set in a dotted key of the runtime's table: not a line devgate can set aside.
        let dotted = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  options.BinaryName = \"crun\"\n";
        assert!(matches!(
            wrap_crun(dotted, w).unwrap_err(),
            EditError::NoTable { .. }
        ));
    }
}
