//! Where the node's kubelet keeps pods (`<--root-dir>/pods`) and their logs (`podLogsDir`):
//! its flags, its KubeletConfiguration file (and `--config-dir` drop-ins), and the running
//! kubelet found through /proc.
//!
//! Pure readers first, then the I/O. Only a process of root's whose name is `kubelet`, in
//! doctor's own mount namespace (the node's, where an operator runs it), counts, so a process another user or a pod's container
//! names kubelet cannot point doctor at a file or a directory; that process's files are
//! opened inside its own root (openat2 RESOLVE_IN_ROOT, no magic links), non-blocking and
//! bounded, so a symlink in its tree stays in its tree and a FIFO or a huge file cannot
//! hold doctor.

use super::error::ConfigError;
use crate::error::Error;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// kubelet's `--root-dir` default; its pods are in `pods` below it.
pub(crate) const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
/// kubelet's `podLogsDir` default.
pub(crate) const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
/// A command line is at most a few KiB; the kernel allows megabytes.
const MAX_CMDLINE: u64 = 256 << 10;
const MAX_CONFIG: u64 = 1 << 20;
/// kubelet's `--config-dir` drop-ins read, at most.
const MAX_DROPINS: usize = 64;

/// The kubelet flags that say where its files are.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Flags {
    pub(crate) config: Option<PathBuf>,
    pub(crate) config_dir: Option<PathBuf>,
    pub(crate) root_dir: Option<PathBuf>,
}

/// kubelet's flags from its arguments after the program name, as pflag reads them:
/// `--name value` or `--name=value`, the last one counting, `--` ending them; an empty
/// value is the flag unset. A name's `_` is `-`, as kubelet's flag set normalizes it
/// (cliflag.WordSepNormalizeFunc).
pub(crate) fn parse_flags(args: &[String]) -> Flags {
    let mut f = Flags::default();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            break;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a, None),
        };
        let slot = match name.replace('_', "-").as_str() {
            "--config" => &mut f.config,
            "--config-dir" => &mut f.config_dir,
            "--root-dir" => &mut f.root_dir,
            _ => {
                i += 1;
                continue;
            }
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                match args.get(i) {
                    Some(v) => v.as_str(),
                    None => break,
                }
            }
        };
        *slot = (!value.is_empty()).then(|| PathBuf::from(value));
        i += 1;
    }
    f
}

/// What a KubeletConfiguration file says of the pod logs directory: None where it leaves
/// `podLogsDir` unset; Some("") where it sets it null or empty. The two differ in a
/// drop-in, which kubelet merges as a JSON merge patch: null there removes the file's
/// podLogsDir, and kubelet's defaulting then makes an empty one /var/log/pods.
pub(crate) fn parse_config(text: &str) -> Result<Option<String>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let keys = if text.trim_start().starts_with('{') {
        json_keys(text)?
    } else {
        yaml_keys(text)?
    };
    let mut kind = None;
    let mut logs = None;
    for (k, v) in keys {
        let slot = match k.as_str() {
            "kind" => &mut kind,
            "podLogsDir" => &mut logs,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("{k} is set twice"));
        }
        *slot = Some(v);
    }
    match kind.flatten() {
        None => {}
        Some(k) if k == "KubeletConfiguration" => {}
        Some(k) => return Err(format!("kind {k:?} is not KubeletConfiguration")),
    }
    Ok(logs.map(Option::unwrap_or_default))
}

/// A JSON object's `kind` and `podLogsDir`: Some(text) for a string, None for null.
fn json_keys(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let mut out = Vec::new();
    for k in ["kind", "podLogsDir"] {
        match map.get(k) {
            None => {}
            Some(serde_json::Value::Null) => out.push((k.to_string(), None)),
            Some(serde_json::Value::String(s)) => out.push((k.to_string(), Some(s.clone()))),
            Some(_) => return Err(format!("{k} is not a string")),
        }
    }
    Ok(out)
}

/// The keys of a YAML document's top-level mapping, each with its scalar (None: null, or a
/// block below it). kubelet's configs are flat at the top where devgate reads them, so
/// this reads only lines that start at column 0 and skips the indented ones of other keys.
/// An indented line that would be part of `kind`'s or `podLogsDir`'s value (YAML lets it
/// sit below its key, or a plain scalar go on there), or an indented top-level mapping, is
/// refused: skipping it would read a value other than kubelet's.
fn yaml_keys(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    // kubelet's go-yaml breaks lines at a lone CR, NEL, LS and PS as well: a key behind
    // one would be a line of its own there, and part of another key's value here.
    let lone_cr = text
        .char_indices()
        .any(|(i, c)| c == '\r' && !text[i + 1..].starts_with('\n'));
    if lone_cr || text.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return Err("a line break devgate does not read (a lone CR, NEL, LS or PS)".into());
    }
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut documents = 0;
    for (n, line) in text.lines().enumerate() {
        let first = line.chars().next();
        if matches!(first, None | Some(' ' | '\t' | '#' | '-' | '%')) {
            // A document start, after a document that had keys, is a second document.
            if line.starts_with("---") {
                documents += 1;
                if documents > 1 || !out.is_empty() {
                    return Err("holds more than one YAML document".into());
                }
                continue;
            }
            // Content below a top-level key (indented, or a block sequence's `-`): part of
            // that key's value. Blank and comment lines are not.
            let body = line.trim_start_matches([' ', '\t']);
            let content = match first {
                Some(' ' | '\t') => !body.is_empty() && !body.starts_with('#'),
                Some('-') => true,
                _ => false,
            };
            if content {
                match out.last() {
                    None => {
                        return Err(format!(
                            "line {}: an indented top-level mapping, which devgate does not read",
                            n + 1
                        ))
                    }
                    Some((k, _)) if matches!(k.as_str(), "kind" | "podLogsDir") => {
                        return Err(format!(
                            "{k}: a value on the lines below, which devgate does not read"
                        ))
                    }
                    Some(_) => {}
                }
            }
            continue;
        }
        if line.starts_with("...") {
            break;
        }
        // An anchor, tag or alias before a key, or an escape in its double quotes: YAML
        // reads the key behind it, which devgate would miss.
        // A flow collection at the top (JSON behind a comment, or YAML's `{a: 1, ...}`):
        // its keys are the document's, on any of its lines.
        if line.starts_with(['{', '[']) {
            return Err(format!(
                "line {}: a flow collection, which devgate does not read",
                n + 1
            ));
        }
        let escaped_key = line
            .strip_prefix('"')
            .is_some_and(|k| k[..k.find('"').unwrap_or(k.len())].contains('\\'));
        if line.starts_with(['&', '!', '*']) || escaped_key {
            return Err(format!(
                "line {}: a key devgate does not read (an escape, anchor, tag or alias)",
                n + 1
            ));
        }
        let (key, rest) =
            yaml_key(line).ok_or_else(|| format!("line {}: not `key: value`", n + 1))?;
        // A key devgate does not read may hold an empty flow collection (`[]`, `{}`), as
        // generated configs write them; it cannot span lines, so it hides no key.
        if !matches!(key.as_str(), "kind" | "podLogsDir") && empty_flow(rest) {
            continue;
        }
        let value = yaml_scalar(rest).map_err(|e| format!("{key}: {e}"))?;
        out.push((key, value));
    }
    Ok(out)
}

/// `[]` or `{}`, then nothing but blanks or a comment.
fn empty_flow(rest: &str) -> bool {
    let v = rest.trim_start();
    let tail = v.strip_prefix("[]").or_else(|| v.strip_prefix("{}"));
    tail.is_some_and(|t| {
        let t = t.trim_start();
        t.is_empty() || t.starts_with('#')
    })
}

/// `key: rest` of a top-level line (the key plain or quoted).
fn yaml_key(line: &str) -> Option<(String, &str)> {
    if let Some(q) = line.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let end = line[1..].find(q)? + 1;
        let rest = line[end + 1..].strip_prefix(':')?;
        return Some((line[1..end].to_string(), rest));
    }
    let at = line
        .char_indices()
        .find(|&(i, c)| {
            c == ':'
                && line[i + 1..]
                    .chars()
                    .next()
                    .map_or(true, |n| n == ' ' || n == '\t')
        })?
        .0;
    Some((line[..at].trim_end().to_string(), &line[at + 1..]))
}

/// A YAML scalar: plain, 'single' or "double" quoted, with its comment cut off. None for a
/// null or for nothing (a block follows). Anything else is refused, not guessed at.
fn yaml_scalar(v: &str) -> Result<Option<String>, String> {
    let v = v.trim_start();
    match v.chars().next() {
        None | Some('#') => Ok(None),
        Some('"') => double_quoted(&v[1..]).map(Some),
        Some('\'') => single_quoted(&v[1..]).map(Some),
        Some('|' | '>') => Err("a block scalar, which devgate does not read".into()),
        Some('{' | '[' | '&' | '*' | '!' | '@' | '`') => Err("not a plain string".into()),
        Some(_) => {
            let end = v
                .char_indices()
                .find(|&(i, c)| c == '#' && v[..i].ends_with([' ', '\t']))
                .map_or(v.len(), |(i, _)| i);
            let plain = v[..end].trim_end();
            Ok((!matches!(plain, "~" | "null" | "Null" | "NULL")).then(|| plain.to_string()))
        }
    }
}

/// The end of a quoted scalar: nothing but blanks or a comment may follow it.
fn after_quote(rest: &str) -> Result<(), String> {
    let r = rest.trim_start();
    if r.is_empty() || r.starts_with('#') {
        Ok(())
    } else {
        Err("text after a quoted string".into())
    }
}

fn single_quoted(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if c != '\'' {
            out.push(c);
        } else if it.peek().is_some_and(|&(_, n)| n == '\'') {
            out.push('\'');
            it.next();
        } else {
            after_quote(&s[i + 1..])?;
            return Ok(out);
        }
    }
    Err("a quoted string that does not end on its line".into())
}

fn double_quoted(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '"' => {
                after_quote(&s[i + 1..])?;
                return Ok(out);
            }
            '\\' => {
                let (_, e) = it
                    .next()
                    .ok_or("a quoted string that does not end on its line")?;
                out.push(match e {
                    '\\' | '"' | '/' => e,
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    'e' => '\x1b',
                    _ => return Err(format!("escape \\{e} is not one devgate reads")),
                });
            }
            c => out.push(c),
        }
    }
    Err("a quoted string that does not end on its line".into())
}

// ---------------------------------------------------------------------------------------
// The running kubelet.

/// A kubelet process: its pid, flags, and where its root and working directory are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Running {
    pub(crate) pid: u32,
    pub(crate) flags: Flags,
    /// `/proc/PID/root`: its files are opened inside it.
    pub(crate) root: PathBuf,
    /// Its working directory, inside its root (a relative `--config` is read from there);
    /// None where it is gone.
    pub(crate) cwd: Option<PathBuf>,
}

/// The running kubelet under `proc` (`/proc`): of the processes named `kubelet` that root
/// runs in doctor's own mount namespace (`self`: the node's, where an operator runs
/// doctor; a test node's, where its kubelet runs in one of its own), the one of lowest pid.
///
/// A container's root is uid 0 too: a pod's process named kubelet, its pid below the
/// node's kubelet's once pids wrap, would otherwise choose the directories doctor passes
/// and tells the operator to set. Every container has a mount namespace of its own.
pub(crate) fn find_running(proc: &Path) -> Option<Running> {
    use std::os::unix::ffi::OsStrExt;
    let pids = fs::read_dir(proc).ok()?;
    let node_mnt = fs::read_link(proc.join("self/ns/mnt")).ok()?;
    let mut found: Option<u32> = None;
    for e in pids.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = proc.join(pid.to_string());
        if read_proc(&dir.join("comm"), 64).is_some_and(|c| c == b"kubelet\n")
            && read_proc(&dir.join("status"), 64 << 10).is_some_and(|s| runs_as_root(&s))
            && fs::read_link(dir.join("ns/mnt")).is_ok_and(|m| m == node_mnt)
        {
            found = Some(found.map_or(pid, |f| f.min(pid)));
        }
    }
    let pid = found?;
    let dir = proc.join(pid.to_string());
    let cmdline = read_proc(&dir.join("cmdline"), MAX_CMDLINE)?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(Running {
        pid,
        flags: parse_flags(&args),
        root: dir.join("root"),
        // A working directory that is gone reads `/dir (deleted)`, a name any user may
        // make anew (in /tmp): no working directory, then.
        cwd: fs::read_link(dir.join("cwd"))
            .ok()
            .filter(|c| c.is_absolute() && !c.as_os_str().as_bytes().ends_with(b" (deleted)")),
    })
}

/// Whether a /proc/PID/status says root runs the process: real and effective uid 0. Not the
/// owner of /proc/PID, which is root's for any process that made itself non-dumpable.
fn runs_as_root(status: &[u8]) -> bool {
    String::from_utf8_lossy(status)
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .is_some_and(|ids| {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            ids.len() >= 2 && ids[0] == "0" && ids[1] == "0"
        })
}

/// A /proc file, at most `max` bytes (None past it or where it cannot be read).
fn read_proc(path: &Path, max: u64) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(max + 1)
        .read_to_end(&mut buf)
        .ok()?;
    (buf.len() as u64 <= max).then_some(buf)
}

/// The text of `path` as the process whose root is `root` sees it: opened inside that root,
/// symlinks resolved inside it and magic links refused, non-blocking, a regular file of at
/// most a MiB. Errors name `path`.
pub(crate) fn read_in_root(root: &Path, path: &Path) -> Result<String, ConfigError> {
    use std::os::unix::ffi::OsStrExt;
    let io = |what: &str, e| ConfigError::Io(Error::io(what.to_string(), path, e));
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .map_err(|e| ConfigError::Io(Error::io("cannot open", root, e)))?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| ConfigError::NotRegular(path.to_path_buf()))?;
    let fd = crate::fsutil::openat2(
        &dir,
        &c,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| io("cannot open", e))?;
    let f = File::from(fd);
    let meta = f.metadata().map_err(|e| io("cannot stat", e))?;
    if !meta.is_file() {
        return Err(ConfigError::NotRegular(path.to_path_buf()));
    }
    let mut buf = Vec::new();
    f.take(MAX_CONFIG + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
    if buf.len() as u64 > MAX_CONFIG {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_CONFIG,
        });
    }
    String::from_utf8(buf).map_err(|_| ConfigError::NotUtf8(path.to_path_buf()))
}

/// The `.conf` drop-ins of `dir` inside `root` as kubelet's filepath.WalkDir finds them:
/// every file (not directory) whose name ends `.conf`, hidden ones too, in the directories
/// below as well, in the walk's order (by name, a directory's files where its name sorts).
/// At most [`MAX_DROPINS`] entries are looked at; more is an error, not a silent cut.
pub(crate) fn dropins_in_root(root: &Path, dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let rootfd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .map_err(|e| ConfigError::Io(Error::io("cannot list", dir, e)))?;
    let mut names: Vec<PathBuf> = Vec::new();
    let mut seen = 0;
    walk_in_root(&rootfd, dir, dir, &mut names, &mut seen)?;
    // Path order is by component: a directory's files sort where its name does, as the
    // walk visits them.
    names.sort();
    Ok(names)
}

/// One directory of [`dropins_in_root`]'s walk, opened inside the root (a link to a
/// directory is not followed: the walk lstats, and kubelet then fails to read it as a file).
fn walk_in_root(
    rootfd: &File,
    top: &Path,
    dir: &Path,
    names: &mut Vec<PathBuf>,
    seen: &mut usize,
) -> Result<(), ConfigError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let io = |e| ConfigError::Io(Error::io("cannot list", dir, e));
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| ConfigError::NotRegular(dir.to_path_buf()))?;
    let fd = crate::fsutil::openat2(
        rootfd,
        &c,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(io)?;
    let listed = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io)?;
    for e in listed {
        let e = e.map_err(io)?;
        *seen += 1;
        if *seen > MAX_DROPINS {
            return Err(ConfigError::Kubelet {
                path: top.to_path_buf(),
                msg: format!("more than {MAX_DROPINS} drop-ins and directories"),
            });
        }
        let path = dir.join(e.file_name());
        if e.file_type().map_err(io)?.is_dir() {
            walk_in_root(rootfd, top, &path, names, seen)?;
        } else if e.file_name().as_bytes().ends_with(b".conf") {
            // filepath.Ext(name) == ".conf": a name that ends so, `.conf` itself too.
            names.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubelet")
            .join(name);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn flags_as_pflag_reads_them() {
        let f = parse_flags(&args(
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
             --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml \
             --container-runtime-endpoint=unix:///var/run/containerd/containerd.sock \
             --node-ip 127.0.0.1 --root-dir /data/kubelet --root-dir=/srv/kubelet",
        ));
        assert_eq!(
            f.config.as_deref(),
            Some(Path::new("/var/lib/kubelet/config.yaml"))
        );
        assert_eq!(f.root_dir.as_deref(), Some(Path::new("/srv/kubelet")));
        assert_eq!(f.config_dir, None);
        let f = parse_flags(&args("--config-dir /etc/kubelet.conf.d -- --root-dir /x"));
        assert_eq!(
            f.config_dir.as_deref(),
            Some(Path::new("/etc/kubelet.conf.d"))
        );
        assert_eq!(f.root_dir, None, "after --");
        assert_eq!(parse_flags(&args("--root-dir")), Flags::default());
        assert_eq!(parse_flags(&args("--config= --v=2")), Flags::default());
    }

    /// kubelet's flag set normalizes `_` in a flag's name to `-`
    /// (cliflag.WordSepNormalizeFunc): `--root_dir` is `--root-dir`. Read as another flag,
    /// doctor would pass /var/lib/kubelet/pods for a kubelet that keeps its pods elsewhere.
    #[test]
    fn flag_names_as_kubelet_normalizes_them() {
        let f = parse_flags(&args(
            "--root-dir /a --root_dir=/data/kubelet --config_dir /etc/k.d --config=/c.yaml",
        ));
        assert_eq!(f.root_dir.as_deref(), Some(Path::new("/data/kubelet")));
        assert_eq!(f.config_dir.as_deref(), Some(Path::new("/etc/k.d")));
        assert_eq!(f.config.as_deref(), Some(Path::new("/c.yaml")));
    }

    #[test]
    fn kubeadm_and_json_configs() {
        assert_eq!(parse_config(&fixture("kubeadm-defaulted.yaml")), Ok(None));
        assert_eq!(
            parse_config(&fixture("kubeadm-podlogsdir.yaml")),
            Ok(Some("/data/log/pods".into()))
        );
        assert_eq!(
            parse_config(&fixture("kubelet-config.json")),
            Ok(Some("/srv/pod-logs".into()))
        );
    }

    #[test]
    fn yaml_scalars_as_yaml_reads_them() {
        for (text, want) in [
            ("podLogsDir: /a # note\n", Some("/a")),
            ("podLogsDir: \"/a b\"  # note\n", Some("/a b")),
            ("podLogsDir: '/it''s'\n", Some("/it's")),
            ("\"podLogsDir\": /q\n", Some("/q")),
            ("podLogsDir: /a#b\n", Some("/a#b")),
            ("---\npodLogsDir: ~\n", Some("")),
            ("podLogsDir:\n", Some("")),
            ("nested:\n  podLogsDir: /not-top\n", None),
            // Generated configs write empty lists and maps in flow style.
            (
                "enforceNodeAllocatable: []\npodLogsDir: /flow # x\n",
                Some("/flow"),
            ),
            (
                "evictionHard: {}  # none\npodLogsDir: /flow\n",
                Some("/flow"),
            ),
            (
                "\u{feff}kind: KubeletConfiguration\npodLogsDir: /bom\n",
                Some("/bom"),
            ),
        ] {
            assert_eq!(parse_config(text), Ok(want.map(String::from)), "{text:?}");
        }
    }

    /// Text a hostile or broken file holds is refused with what is wrong, never guessed at.
    #[test]
    fn odd_configs_are_refused() {
        for (text, err) in [
            (
                "podLogsDir: /a\npodLogsDir: /b\n",
                "podLogsDir is set twice",
            ),
            (
                "kind: KubeProxyConfiguration\n",
                "kind \"KubeProxyConfiguration\" is not KubeletConfiguration",
            ),
            (
                "podLogsDir: |\n  /a\n",
                "podLogsDir: a block scalar, which devgate does not read",
            ),
            ("podLogsDir: [/a]\n", "podLogsDir: not a plain string"),
            ("podLogsDir: []\n", "podLogsDir: not a plain string"),
            (
                "evictionHard: [\npodLogsDir: /x\n]\n",
                "evictionHard: not a plain string",
            ),
            (
                "podLogsDir: \"/a\n",
                "podLogsDir: a quoted string that does not end on its line",
            ),
            (
                "podLogsDir: \"/a\" x\n",
                "podLogsDir: text after a quoted string",
            ),
            (
                "podLogsDir: \"\\q\"\n",
                "podLogsDir: escape \\q is not one devgate reads",
            ),
            (
                "kind: KubeletConfiguration\n---\nkind: X\n",
                "holds more than one YAML document",
            ),
            ("just words\n", "line 1: not `key: value`"),
            ("{\"podLogsDir\": 7}", "podLogsDir is not a string"),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        assert!(parse_config("{")
            .unwrap_err()
            .starts_with("not a JSON object"));
        // Control characters survive the parse: the doctor line escapes them when printed.
        assert_eq!(
            parse_config("podLogsDir: \"/a\\e[31m\"\n"),
            Ok(Some("/a\x1b[31m".into()))
        );
    }

    /// A fake /proc: a kubelet of root's, and one of another user's that must not count.
    #[test]
    fn the_running_kubelet_is_roots() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-proc");
        let proc = d.join("proc");
        let mk = |pid: u32, comm: &str, cmdline: &[&str]| {
            let p = proc.join(pid.to_string());
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(p.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
            fs::write(
                p.join("status"),
                "Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n",
            )
            .unwrap();
            fs::create_dir_all(p.join("ns")).unwrap();
            symlink("mnt:[4026531841]", p.join("ns/mnt")).unwrap();
            p
        };
        mk(1, "systemd", &["/sbin/init"]);
        // doctor, in the same namespace.
        symlink("1", proc.join("self")).unwrap();
        assert_eq!(find_running(&proc), None);
        // Another user's kubelet: its /proc entry may be root's (a non-dumpable process's
        // is), its status says who runs it.
        let other = mk(7, "kubelet", &["/tmp/kubelet", "--root-dir", "/tmp/evil"]);
        fs::write(other.join("status"), "Uid:\t1000\t1000\t1000\t1000\n").unwrap();
        assert_eq!(find_running(&proc), None, "another user's kubelet");
        fs::write(other.join("status"), "Uid:\t1000\t0\t0\t0\n").unwrap();
        assert_eq!(
            find_running(&proc),
            None,
            "a set-uid kubelet run by another user"
        );
        mk(
            40,
            "kubelet",
            &[
                "/usr/bin/kubelet",
                "--config=/etc/k.yaml",
                "--root-dir",
                "/srv/k",
            ],
        );
        mk(
            41,
            "kubelet",
            &["/usr/bin/kubelet", "--root-dir", "/second"],
        );
        let r = find_running(&proc).unwrap();
        assert_eq!(r.pid, 40);
        assert_eq!(r.flags.root_dir.as_deref(), Some(Path::new("/srv/k")));
        assert_eq!(r.flags.config.as_deref(), Some(Path::new("/etc/k.yaml")));
        assert_eq!(r.root, proc.join("40/root"));
        // A command line past the bound is not read at all.
        fs::remove_dir_all(proc.join("41")).unwrap();
        fs::write(
            proc.join("40/cmdline"),
            vec![b'x'; (MAX_CMDLINE + 1) as usize],
        )
        .unwrap();
        assert_eq!(find_running(&proc), None);
        fs::remove_dir_all(&d).unwrap();
    }

    /// kubelet walks its --config-dir (filepath.WalkDir): every file whose extension is
    /// `.conf`, a hidden one too, and those in directories below, in the walk's order. A
    /// drop-in doctor skipped could set podLogsDir unseen, and doctor would pass the
    /// directory the file before it named.
    #[test]
    fn dropins_are_the_files_kubelets_walk_finds() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-walk");
        let root = d.join("root");
        let k = root.join("etc/k.d");
        fs::create_dir_all(k.join("50.d/deeper")).unwrap();
        fs::create_dir_all(k.join("dir.conf")).unwrap();
        for n in [
            "10.conf",
            ".99-hidden.conf",
            ".conf",
            "notes.txt",
            "50.d/x.conf",
            "50.d/deeper/y.conf",
            "dir.conf/z.conf",
            "60.conf",
        ] {
            fs::write(k.join(n), "").unwrap();
        }
        // A link to a directory is a file to the walk, which kubelet then fails to read.
        symlink("50.d", k.join("70-link.conf")).unwrap();
        let want: Vec<PathBuf> = [
            ".99-hidden.conf",
            ".conf",
            "10.conf",
            "50.d/deeper/y.conf",
            "50.d/x.conf",
            "60.conf",
            "70-link.conf",
            "dir.conf/z.conf",
        ]
        .iter()
        .map(|n| Path::new("/etc/k.d").join(n))
        .collect();
        assert_eq!(dropins_in_root(&root, Path::new("/etc/k.d")).unwrap(), want);
        // A tree past the bound is refused, not cut short.
        for i in 0..MAX_DROPINS {
            fs::create_dir_all(k.join(format!("many/{i}"))).unwrap();
        }
        assert!(dropins_in_root(&root, Path::new("/etc/k.d")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// YAML lets a value sit on the lines below its key, a plain scalar go on over
    /// indented lines, and a whole document be indented: each reads a podLogsDir devgate
    /// would not see (and pass kubelet's default, or a cut-off directory), so each is
    /// refused where it concerns the keys devgate reads.
    #[test]
    fn a_value_below_its_key_or_an_indented_document_is_refused() {
        let below = "podLogsDir: a value on the lines below, which devgate does not read";
        for (text, err) in [
            ("podLogsDir:\n  /data/logs\n", below),
            ("podLogsDir:\n\n  # the logs\n  \"/data/logs\"\n", below),
            ("podLogsDir: /data\n  logs\n", below),
            ("podLogsDir:\n- /a\n", below),
            (
                "  kind: KubeletConfiguration\n  podLogsDir: /data/logs\n",
                "line 1: an indented top-level mapping, which devgate does not read",
            ),
            (
                "---\n  podLogsDir: /data/logs\n",
                "line 2: an indented top-level mapping, which devgate does not read",
            ),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        // Other keys' blocks, comments and blank lines stay as they were read.
        for (text, want) in [
            (
                "clusterDNS:\n- 10.96.0.10\npodLogsDir: /x\n  # note\n\nauthentication:\n  x: 1\n",
                Some("/x"),
            ),
            ("# head\n  # indented comment\npodLogsDir: /y\n", Some("/y")),
        ] {
            assert_eq!(parse_config(text), Ok(want.map(String::from)), "{text:?}");
        }
    }

    /// kubelet's YAML (go-yaml, YAML 1.1) breaks lines at a lone CR, NEL, LS and PS too, and
    /// reads a key behind an anchor or a tag, or with an escape in its double quotes, as
    /// the key: each of these read `podLogsDir` for kubelet (sigs.k8s.io/yaml's
    /// YAMLToJSON, checked) that a line-by-line reader of plain keys would not see.
    #[test]
    fn keys_go_yaml_reads_are_not_missed() {
        for (text, err) in [
            (
                "foo: bar\rpodLogsDir: /cr\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "foo: bar\u{2028}podLogsDir: /ls\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "foo: bar\u{85}podLogsDir: /nel\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "\"podLogs\\x44ir\": /esc\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
            (
                "&a podLogsDir: /anchor\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
            (
                "!!str podLogsDir: /tag\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        // An escape in a quoted key's value is the value's.
        assert_eq!(
            parse_config("\"podLogsDir\": \"/a\\tb\"\n"),
            Ok(Some("/a\tb".into()))
        );
        // A document that is one flow mapping (JSON behind a comment): YAML reads its keys.
        for text in [
            "# kubelet\n{\"apiVersion\": \"v1\", \"podLogsDir\": \"/flow\"}\n",
            "# kubelet\n{a: 1,\n podLogsDir: /flow2}\n",
        ] {
            assert_eq!(
                parse_config(text),
                Err("line 2: a flow collection, which devgate does not read".into()),
                "{text:?}"
            );
        }
        // CRLF is a line break devgate reads.
        assert_eq!(
            parse_config("kind: KubeletConfiguration\r\npodLogsDir: /crlf\r\n"),
            Ok(Some("/crlf".into()))
        );
    }

    /// A pod's container runs as root, and may name its process kubelet and give it a pid
    /// below the node's kubelet's (pids wrap): its flags are the pod author's, and doctor
    /// would pass, or tell the operator to set, the directories it names. Only a kubelet in
    /// doctor's own mount namespace (`self`) counts.
    #[test]
    fn a_kubelet_in_a_containers_mount_namespace_does_not_count() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-ns");
        let proc = d.join("proc");
        let mk = |pid: u32, comm: &str, mnt: Option<&str>, cmdline: &[&str]| {
            let p = proc.join(pid.to_string());
            fs::create_dir_all(p.join("ns")).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(p.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
            fs::write(p.join("status"), "Uid:\t0\t0\t0\t0\n").unwrap();
            if let Some(m) = mnt {
                symlink(m, p.join("ns/mnt")).unwrap();
            }
        };
        mk(1, "systemd", Some("mnt:[4026531841]"), &["/sbin/init"]);
        // doctor itself, in the node's namespace.
        fs::create_dir_all(proc.join("self/ns")).unwrap();
        symlink("mnt:[4026531841]", proc.join("self/ns/mnt")).unwrap();
        mk(
            7,
            "kubelet",
            Some("mnt:[4026532999]"),
            &["kubelet", "--root-dir", "/pod-chosen"],
        );
        assert_eq!(find_running(&proc), None, "a container's root kubelet");
        mk(8, "kubelet", None, &["kubelet", "--root-dir", "/no-ns"]);
        assert_eq!(
            find_running(&proc),
            None,
            "a kubelet whose namespace is unread"
        );
        mk(
            900,
            "kubelet",
            Some("mnt:[4026531841]"),
            &["/usr/bin/kubelet", "--root-dir", "/srv/k"],
        );
        let r = find_running(&proc).unwrap();
        assert_eq!(r.pid, 900);
        assert_eq!(r.flags.root_dir.as_deref(), Some(Path::new("/srv/k")));
        fs::remove_dir_all(&d).unwrap();
    }

    /// kubelet's files are read inside its root: a symlink to / leads to its own root, a
    /// FIFO does not block, and a huge file is refused.
    #[test]
    fn files_are_read_inside_the_kubelets_root() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-root");
        let root = d.join("root");
        fs::create_dir_all(root.join("etc/conf.d")).unwrap();
        fs::write(root.join("etc/k.yaml"), "podLogsDir: /in-root\n").unwrap();
        assert_eq!(
            read_in_root(&root, Path::new("/etc/k.yaml")).unwrap(),
            "podLogsDir: /in-root\n"
        );
        // Outside the root, a file doctor could read; a link to it resolves inside.
        fs::write(d.join("secret"), "podLogsDir: /outside\n").unwrap();
        symlink(d.join("secret"), root.join("etc/abs")).unwrap();
        symlink("../../secret", root.join("etc/rel")).unwrap();
        for l in ["/etc/abs", "/etc/rel", "/../secret"] {
            assert!(read_in_root(&root, Path::new(l)).is_err(), "{l}");
        }
        symlink("/etc/k.yaml", root.join("etc/inside")).unwrap();
        assert!(read_in_root(&root, Path::new("/etc/inside")).is_ok());
        nix::unistd::mkfifo(
            &root.join("etc/fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(
            read_in_root(&root, Path::new("/etc/fifo")).unwrap_err(),
            ConfigError::NotRegular("/etc/fifo".into())
        );
        fs::write(root.join("etc/huge"), vec![b'#'; (MAX_CONFIG + 1) as usize]).unwrap();
        assert!(matches!(
            read_in_root(&root, Path::new("/etc/huge")).unwrap_err(),
            ConfigError::TooLarge { .. }
        ));
        // Drop-ins: `.conf` files by name, not others.
        for n in ["20-b.conf", "10-a.conf", "notes.txt"] {
            fs::write(root.join("etc/conf.d").join(n), "").unwrap();
        }
        assert_eq!(
            dropins_in_root(&root, Path::new("/etc/conf.d")).unwrap(),
            [
                PathBuf::from("/etc/conf.d/10-a.conf"),
                "/etc/conf.d/20-b.conf".into()
            ]
        );
        for i in 0..MAX_DROPINS {
            fs::write(root.join(format!("etc/conf.d/x{i}.conf")), "").unwrap();
        }
        assert!(dropins_in_root(&root, Path::new("/etc/conf.d")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
