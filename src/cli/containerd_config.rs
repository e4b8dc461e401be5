//! containerd's `config.toml`, edited so that its CRI plugin starts every container of its
//! default runtime from devgate's base spec (`install-host --enable`), and the edit taken
//! out again (`uninstall-host`).
//!
//! The edit adds lines and nothing else, each ending in [`MARK`]: the operator's comments
//! and layout stay, and removal drops exactly the marked lines, so the file comes back byte
//! for byte. config.toml, not an import of devgate's own: containerd 1.6 and 1.7 replace a
//! whole plugin section from an imported file instead of merging it (where an import
//! already holds that section, containerd_dropin.rs copies it).
//! Every edit is checked by parsing the result: devgate's keys are there, and apart from
//! them the document reads as before. An edit that cannot be made that way is refused,
//! with what to add by hand.

use std::fmt;
use std::path::Path;
use toml::{Table, Value};

/// What ends every line devgate adds.
pub(super) const MARK: &str = "# devgate install-host";
/// The annotation kubelet's terminationMessagePolicy reaches devgate's poststop through
/// (docs/poststop.md).
pub(super) const ANNOTATION: &str = "io.kubernetes.container.terminationMessagePolicy";

/// Config versions 2 (containerd 1.x; 2.x reads it too) and 3 (containerd 2.x) name the
/// CRI runtime section differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V2,
    V3,
}

impl Version {
    fn cri(self) -> [&'static str; 3] {
        match self {
            Version::V2 => ["plugins", "io.containerd.grpc.v1.cri", "containerd"],
            Version::V3 => ["plugins", "io.containerd.cri.v1.runtime", "containerd"],
        }
    }
}

/// What an edit gives.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Edit {
    /// The file already reads as devgate needs (or, for removal, holds no line of devgate's).
    Unchanged,
    /// The file's new text.
    Changed(String),
}

/// Why the file was not edited.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EditError {
    NotToml(String),
    /// Version 1 (no `version` key): its plugin names differ again.
    Version1,
    /// The default runtime already starts from another base spec.
    OtherSpec {
        runtime: String,
        spec: String,
    },
    /// The runtime's section is not a `[table]` of its own (inline, dotted keys), or is
    /// missing for a runtime that is not runc.
    NoTable {
        table: String,
    },
    /// A key devgate reads holds a value of the wrong type.
    BadValue {
        key: String,
    },
    /// The edited text did not read as intended (a header inside a multi-line string).
    Unverified,
}

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let esc = |s: &str| s.escape_debug().to_string();
        match self {
            EditError::NotToml(e) => write!(f, "not valid TOML: {}", esc(e)),
            EditError::Version1 => f.write_str(
                "config version 1 (no `version` key); migrate it first \
                 (`containerd config migrate`)",
            ),
            EditError::OtherSpec { runtime, spec } => write!(
                f,
                "runtime \"{}\" already starts from base spec \"{}\"; devgate cannot share it: \
                 add devgate's hooks to it (devgate hooks-config --runtime containerd) instead",
                esc(runtime),
                esc(spec)
            ),
            EditError::NoTable { table } => write!(
                f,
                "[{}] is not a table of its own here; add base_runtime_spec and \
                 container_annotations to it by hand (docs/install.md)",
                esc(table)
            ),
            EditError::BadValue { key } => write!(f, "{} has a value of the wrong type", esc(key)),
            EditError::Unverified => f.write_str(
                "the edit would not read as intended; add base_runtime_spec and \
                 container_annotations by hand (docs/install.md)",
            ),
        }
    }
}

type Result<T> = std::result::Result<T, EditError>;

pub(super) fn parse(text: &str) -> Result<Table> {
    toml::from_str::<Table>(text).map_err(|e| EditError::NotToml(e.message().to_string()))
}

pub(super) fn lookup<'a>(t: &'a Table, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let v = t.get(first)?;
    match rest {
        [] => Some(v),
        _ => lookup(v.as_table()?, rest),
    }
}

pub(super) fn version(t: &Table) -> Result<Version> {
    match t.get("version") {
        None if t.is_empty() => Ok(Version::V2),
        None => Err(EditError::Version1),
        Some(Value::Integer(2)) => Ok(Version::V2),
        Some(Value::Integer(3)) => Ok(Version::V3),
        Some(Value::Integer(1)) => Err(EditError::Version1),
        Some(_) => Err(EditError::BadValue {
            key: "version".into(),
        }),
    }
}

/// The path of the default runtime's table: `…containerd.runtimes.<default_runtime_name>`.
pub(super) fn runtime_path(t: &Table, v: Version) -> Result<Vec<String>> {
    let mut path: Vec<String> = v.cri().iter().map(|s| s.to_string()).collect();
    path.push("default_runtime_name".into());
    let name = match lookup(t, &path) {
        None => "runc".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(EditError::BadValue {
                key: path.join("."),
            })
        }
    };
    path.pop();
    path.extend(["runtimes".to_string(), name]);
    Ok(path)
}

/// A TOML basic string.
pub(super) fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A table header naming `path`, keys quoted where they hold more than bare-key letters.
fn header(path: &[String]) -> String {
    let keys: Vec<String> = path
        .iter()
        .map(|k| {
            let bare = !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if bare {
                k.clone()
            } else {
                quoted(k)
            }
        })
        .collect();
    format!("[{}]", keys.join("."))
}

/// The key path a `[table]` header line names, if `line` is one.
pub(super) fn header_path(line: &str) -> Option<Vec<String>> {
    let l = line.trim_start();
    if !l.starts_with('[') || l.starts_with("[[") {
        return None;
    }
    let mut t = parse(l).ok()?;
    let mut path = Vec::new();
    loop {
        if t.len() != 1 {
            return (t.is_empty() && !path.is_empty()).then_some(path);
        }
        let (k, v) = t.into_iter().next()?;
        path.push(k);
        t = match v {
            Value::Table(inner) => inner,
            _ => return None,
        };
    }
}

/// What the default runtime's table already holds of devgate's two keys.
struct Present {
    spec: bool,
    annotations: bool,
}

fn present(rt: Option<&Value>, path: &[String], spec: &str) -> Result<Present> {
    let Some(rt) = rt else {
        return Ok(Present {
            spec: false,
            annotations: false,
        });
    };
    let rt = rt.as_table().ok_or_else(|| EditError::NoTable {
        table: path.join("."),
    })?;
    let key = |k: &str| format!("{}.{k}", path.join("."));
    let spec = match rt.get("base_runtime_spec") {
        None => false,
        Some(Value::String(s)) if s.is_empty() => false,
        Some(Value::String(s)) if s == spec => true,
        Some(Value::String(s)) => {
            return Err(EditError::OtherSpec {
                runtime: path.last().cloned().unwrap_or_default(),
                spec: s.clone(),
            })
        }
        Some(_) => {
            return Err(EditError::BadValue {
                key: key("base_runtime_spec"),
            })
        }
    };
    // The operator's own list stays as it is, with or without devgate's annotation
    // (doctor says what is lost without it).
    let annotations = match rt.get("container_annotations") {
        None => false,
        Some(Value::Array(_)) => true,
        Some(_) => {
            return Err(EditError::BadValue {
                key: key("container_annotations"),
            })
        }
    };
    Ok(Present { spec, annotations })
}

/// `text` with devgate's keys set on containerd's default runtime: `base_runtime_spec` to
/// `spec`, and `container_annotations` to devgate's annotation where the runtime has none.
pub(super) fn enable(text: &str, spec: &Path) -> Result<Edit> {
    let before = parse(text)?;
    let v = version(&before)?;
    let path = runtime_path(&before, v)?;
    let spec_s = spec.to_string_lossy();
    let has = present(lookup(&before, &path), &path, &spec_s)?;
    if has.spec {
        return Ok(Edit::Unchanged);
    }
    let mut keys = vec![format!("base_runtime_spec = {}", quoted(&spec_s))];
    if !has.annotations {
        keys.push(format!("container_annotations = [{}]", quoted(ANNOTATION)));
    }
    let marked = |l: &str| format!("{l} {MARK}\n");
    let at = text
        .split_inclusive('\n')
        .scan(0, |end, line| {
            *end += line.len();
            Some((*end, line))
        })
        .find(|(_, line)| header_path(line).as_deref() == Some(&path[..]))
        .map(|(end, _)| end);
    let out = match at {
        Some(end) => {
            let mut out = text[..end].to_string();
            if !out.ends_with('\n') {
                out.push('\n');
            }
            keys.iter()
                .for_each(|k| out.push_str(&marked(&format!("  {k}"))));
            out.push_str(&text[end..]);
            out
        }
        None => {
            // Only runc's table may be made: another runtime needs its own runtime_type.
            let runc = path.last().is_some_and(|n| n == "runc");
            if lookup(&before, &path).is_some() || !runc {
                return Err(EditError::NoTable {
                    table: path.join("."),
                });
            }
            let mut out = text.to_string();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            if before.is_empty() {
                out.push_str(&marked("version = 2"));
            }
            out.push_str(&format!("{MARK}: devgate's base spec for the CRI plugin\n"));
            out.push_str(&marked(&header(&path)));
            out.push_str(&marked("  runtime_type = \"io.containerd.runc.v2\""));
            keys.iter()
                .for_each(|k| out.push_str(&marked(&format!("  {k}"))));
            out
        }
    };
    verify(text, &out, &path, &spec_s)?;
    Ok(Edit::Changed(out))
}

/// `text` without the lines devgate added, and with the lines it set aside ([`WAS`],
/// containerd_crun.rs) back.
pub(super) fn disable(text: &str) -> Result<Edit> {
    let kept: String = text
        .split_inclusive('\n')
        .filter_map(|l| match l.strip_prefix(WAS) {
            Some(orig) => Some(orig),
            None => (!is_marked(l)).then_some(l),
        })
        .collect();
    if kept == text {
        return Ok(Edit::Unchanged);
    }
    parse(&kept)?;
    Ok(Edit::Changed(kept))
}

fn is_marked(line: &str) -> bool {
    line.trim_end().ends_with(MARK) || line.trim_start().starts_with(MARK)
}

/// What starts an operator's line devgate set aside (commented out) to set the key itself
/// (containerd_crun.rs); removal gives the line back as it was.
pub(super) const WAS: &str = "# devgate install-host set aside: ";

/// The edited text sets devgate's spec on the runtime, and without devgate's lines reads
/// as `text` does without them.
fn verify(text: &str, out: &str, path: &[String], spec: &str) -> Result<()> {
    let after = parse(out).map_err(|_| EditError::Unverified)?;
    let set = lookup(&after, path)
        .and_then(|rt| rt.get("base_runtime_spec"))
        .and_then(Value::as_str);
    if set != Some(spec) {
        return Err(EditError::Unverified);
    }
    let base = |t: &str| -> Result<String> {
        Ok(match disable(t)? {
            Edit::Changed(s) => s,
            Edit::Unchanged => t.to_string(),
        })
    };
    let Edit::Changed(_) = disable(out)? else {
        return Err(EditError::Unverified);
    };
    if parse(&base(out)?).ok() != parse(&base(text)?).ok() {
        return Err(EditError::Unverified);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "/etc/containerd/devgate-base-spec.json";

    fn on(text: &str) -> String {
        match enable(text, Path::new(SPEC)).unwrap() {
            Edit::Changed(t) => t,
            Edit::Unchanged => panic!("unchanged"),
        }
    }

    fn spec_of(text: &str, path: &[&str]) -> Option<String> {
        let t = parse(text).unwrap();
        let p: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        lookup(&t, &p)?
            .get("base_runtime_spec")?
            .as_str()
            .map(str::to_string)
    }

    const V2_RUNC: [&str; 5] = [
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
        "runc",
    ];

    /// Debian's own config.toml (bookworm's and forky's containerd packages ship it).
    const DEBIAN: &str =
        "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    \
        [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n      \
        conf_dir = \"/etc/cni/net.d\"\n  [plugins.\"io.containerd.internal.v1.opt\"]\n    \
        path = \"/var/lib/containerd/opt\"\n";

    #[test]
    fn debian_config_gains_a_runc_table_and_comes_back_byte_for_byte() {
        let out = on(DEBIAN);
        assert_eq!(spec_of(&out, &V2_RUNC).as_deref(), Some(SPEC));
        let t = parse(&out).unwrap();
        let rt = lookup(&t, &V2_RUNC.map(String::from)).unwrap();
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(
            rt["container_annotations"].as_array().unwrap()[0].as_str(),
            Some(ANNOTATION)
        );
        assert_eq!(disable(&out).unwrap(), Edit::Changed(DEBIAN.to_string()));
        // Twice is once.
        assert_eq!(enable(&out, Path::new(SPEC)).unwrap(), Edit::Unchanged);
    }

    #[test]
    fn an_existing_runc_table_gets_the_keys_under_its_header_and_keeps_its_comments() {
        let text = "version = 2\n# the operator's note\n[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc] # runc\n  runtime_type = \"io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n    SystemdCgroup = true\n";
        let out = on(text);
        assert!(out.contains("# the operator's note\n"));
        let t = parse(&out).unwrap();
        let rt = lookup(&t, &V2_RUNC.map(String::from)).unwrap();
        assert_eq!(rt["base_runtime_spec"].as_str(), Some(SPEC));
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(disable(&out).unwrap(), Edit::Changed(text.to_string()));
    }

    #[test]
    fn version_3_and_the_default_runtime_are_followed() {
        let text = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'nvidia'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n";
        let out = on(text);
        let p = [
            "plugins",
            "io.containerd.cri.v1.runtime",
            "containerd",
            "runtimes",
            "nvidia",
        ];
        assert_eq!(spec_of(&out, &p).as_deref(), Some(SPEC));
        assert_eq!(disable(&out).unwrap(), Edit::Changed(text.to_string()));
    }

    #[test]
    fn an_empty_or_missing_file_becomes_a_version_2_config() {
        let out = on("");
        assert!(out.starts_with("version = 2 "));
        assert_eq!(spec_of(&out, &V2_RUNC).as_deref(), Some(SPEC));
        assert_eq!(disable(&out).unwrap(), Edit::Changed(String::new()));
    }

    #[test]
    fn refusals_name_what_to_do() {
        let other = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  base_runtime_spec = \"/etc/mine.json\"\n";
        let e = enable(other, Path::new(SPEC)).unwrap_err();
        assert!(matches!(&e, EditError::OtherSpec { spec, .. } if spec == "/etc/mine.json"));
        assert_eq!(
            enable("[plugins]\n", Path::new(SPEC)).unwrap_err(),
            EditError::Version1
        );
        // A default runtime with no table of its own: only runc's may be made.
        let nv = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n";
        assert!(matches!(
            enable(nv, Path::new(SPEC)).unwrap_err(),
            EditError::NoTable { .. }
        ));
        // Inline: the keys cannot be added without rewriting the operator's line.
        let inline = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n  runc = { runtime_type = \"io.containerd.runc.v2\" }\n";
        assert!(matches!(
            enable(inline, Path::new(SPEC)).unwrap_err(),
            EditError::NoTable { .. }
        ));
        assert!(matches!(
            enable("version = [", Path::new(SPEC)).unwrap_err(),
            EditError::NotToml(_)
        ));
    }

    #[test]
    fn a_header_inside_a_multi_line_string_is_not_edited() {
        // The only "header" is text in a string: the edit would land in it and is refused
        // rather than written.
        let text = "version = 2\nnote = '''\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n'''\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
        assert_eq!(
            enable(text, Path::new(SPEC)).unwrap_err(),
            EditError::Unverified
        );
    }

    #[test]
    fn an_operator_list_of_annotations_is_kept() {
        let text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  container_annotations = [\"a.b/c\"]\n";
        let out = on(text);
        assert_eq!(out.matches("container_annotations").count(), 1);
        assert_eq!(spec_of(&out, &V2_RUNC).as_deref(), Some(SPEC));
    }

    /// containerd 1.6 and 1.7 replace a whole plugin section from an imported file (and
    /// 2.x may take `default_runtime_name` from one): devgate's lines in config.toml would
    /// then name the spec for no runtime containerd uses, while enable said it was done.
    #[test]
    fn a_config_that_imports_drop_ins_is_edited_in_its_own_text() {
        // What containerd makes of the drop-ins is its own merge: install-host asks the
        // host's containerd (`config dump`) after the edit (enable::check_effective, tested
        // in tests/e2e_install_enable.rs); the text edit itself is the same.
        let text = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n";
        assert_eq!(spec_of(&on(text), &V2_RUNC).as_deref(), Some(SPEC));
        let none = "version = 2\nimports = []\n";
        assert_eq!(spec_of(&on(none), &V2_RUNC).as_deref(), Some(SPEC));
    }

    #[test]
    fn removal_drops_only_marked_lines() {
        assert_eq!(disable(DEBIAN).unwrap(), Edit::Unchanged);
        let text = format!("{DEBIAN}  base_runtime_spec = \"/x\" {MARK}\n");
        assert_eq!(disable(&text).unwrap(), Edit::Changed(DEBIAN.to_string()));
    }
}
