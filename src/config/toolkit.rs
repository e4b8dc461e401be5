//! The NVIDIA container toolkit's config.toml, read for two keys: the top-level
//! `accept-nvidia-visible-devices-envvar-when-unprivileged`, the default of
//! `gpu.env_selectors`, and `accept-nvidia-visible-devices-as-volume-mounts`
//! ([`volume_mounts`]), which decides whether a legacy CUDA image with the device plugin's
//! mounts gets those GPUs or every GPU.
//!
//! The toolkit (api/config/v1: `GetConfigFilePath`; its hook's `-config` flag first) reads
//! `-config`, else `NVIDIA_CTK_CONFIG_FILE_PATH`, else `$XDG_CONFIG_HOME/<rel>`, else
//! `/etc/<rel>`; the GPU operator's runtime wrappers set the variable to the file under its
//! toolkit root. devgate runs in runc's environment, not the toolkit's, so it cannot know
//! that choice: unless `nvidia_toolkit_config` names the file, every place the toolkit may
//! read is looked at, and the variable counts as not selecting only when every file there
//! says so. Any doubt (a file that does not parse, a key that is not a boolean) reads as
//! selecting: devgate then checks more GPUs, never fewer.

use crate::fsutil::read_regular_file;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub const KEY: &str = "accept-nvidia-visible-devices-envvar-when-unprivileged";
/// Whether the toolkit reads the device plugin's mounts (`VisibleDevices`); default false.
pub const MOUNTS_KEY: &str = "accept-nvidia-visible-devices-as-volume-mounts";
/// The toolkit's file, relative to its config root (`RelativeFilePath`).
const RELATIVE: &str = "nvidia-container-runtime/config.toml";
/// The toolkit's default config root.
const ETC_ROOT: &str = "/etc";
/// The GPU operator's default toolkit root (`/usr/local/nvidia` + `toolkit`), whose
/// wrappers name `<root>/.config/nvidia-container-runtime/config.toml`.
pub const OPERATOR_ROOT: &str = "/usr/local/nvidia/toolkit";
const MAX_BYTES: u64 = 64 * 1024;

/// What one file says about [`KEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Says {
    /// No such file: the toolkit then uses its defaults (the key true).
    Absent,
    /// The file parses and sets the key at the top level.
    Key(bool),
    /// The file parses and does not set it: the toolkit's default, true.
    Unset,
    /// Unreadable, too large, not UTF-8, not TOML, or the key is not a boolean: the
    /// toolkit fails to load such a file, so what it would do is not known.
    Bad(String),
}

impl Says {
    /// Whether this file lets `NVIDIA_VISIBLE_DEVICES` select, as devgate takes it.
    fn selects(&self) -> bool {
        !matches!(self, Says::Key(false))
    }
}

/// Where devgate looked and what each place said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// `nvidia_toolkit_config` named the file: only it was read.
    pub explicit: bool,
    pub files: Vec<(PathBuf, Says)>,
}

impl Reading {
    /// The variable selects unless a file is there and every file there says false.
    pub fn env_selectors(&self) -> bool {
        let present: Vec<&Says> = self
            .files
            .iter()
            .map(|(_, s)| s)
            .filter(|s| **s != Says::Absent)
            .collect();
        present.is_empty() || present.iter().any(|s| s.selects())
    }

    /// The files present that disagree about the key (none when they agree).
    pub fn disagreeing(&self) -> bool {
        let mut present = self.files.iter().filter(|(_, s)| *s != Says::Absent);
        match present.next() {
            Some((_, first)) => present.any(|(_, s)| s.selects() != first.selects()),
            None => false,
        }
    }

    /// One warning line for the files devgate could not read as the toolkit would.
    pub fn warning(&self) -> Option<String> {
        let bad: Vec<String> = self
            .files
            .iter()
            .filter_map(|(p, s)| match s {
                Says::Bad(why) => Some(format!("{}: {why}", p.display())),
                _ => None,
            })
            .collect();
        (!bad.is_empty()).then(|| {
            format!(
                "devgate: warning: NVIDIA toolkit config {}; NVIDIA_VISIBLE_DEVICES is taken \
                 as selecting GPUs",
                bad.join("; ")
            )
        })
    }
}

/// What a config.toml's text says about the boolean `key` ([`KEY`], [`MOUNTS_KEY`]), read
/// as TOML: only the top-level key counts (one under `[nvidia-container-cli]` is that
/// table's).
fn parse_key(text: &str, key: &str) -> Says {
    let table = match text.parse::<toml::Table>() {
        Ok(t) => t,
        Err(e) => return Says::Bad(format!("is not TOML: {}", first_line(e.message()))),
    };
    match table.get(key) {
        None => Says::Unset,
        Some(toml::Value::Boolean(b)) => Says::Key(*b),
        Some(v) => Says::Bad(format!("{key} is a {}, not a boolean", v.type_str())),
    }
}

/// The variables a config.toml's top-level `swarm-resource` names, as the toolkit reads
/// them (`WithPreferredVisibleDevicesEnvVars`: split on commas, trimmed, empty ones
/// skipped); none where the text does not parse or the key is not a string.
pub fn swarm_resource(text: &str) -> Vec<String> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    match table.get("swarm-resource") {
        Some(toml::Value::String(v)) => v
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// [`swarm_resource`] of the file at `path`, read as [`read`] reads it.
pub fn read_swarm_resource(path: &Path) -> Vec<String> {
    read_regular_file(path, MAX_BYTES, "NVIDIA toolkit config")
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .map_or_else(Vec::new, |t| swarm_resource(&t))
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// Reads one file (a regular file, not followed through a final symlink, bounded).
pub fn read(path: &Path) -> Says {
    read_key(path, KEY)
}

/// Whether the toolkit takes the device plugin's mounts instead of the variable
/// ([`MOUNTS_KEY`]): only where a file is there and every file there sets it true. Its
/// default, an unset key, and any doubt read as false: a legacy CUDA image then gets every
/// GPU, and devgate checks more GPUs, never fewer. `explicit` as in [`reading`].
pub fn volume_mounts(explicit: Option<&Path>, candidates: &[PathBuf]) -> bool {
    let files = match explicit {
        Some(p) => vec![p.to_path_buf()],
        None => candidates.to_vec(),
    };
    let present: Vec<Says> = files
        .iter()
        .map(|p| read_key(p, MOUNTS_KEY))
        .filter(|s| *s != Says::Absent)
        .collect();
    !present.is_empty() && present.iter().all(|s| *s == Says::Key(true))
}

fn read_key(path: &Path, key: &str) -> Says {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Says::Absent,
        _ => {}
    }
    match read_regular_file(path, MAX_BYTES, "NVIDIA toolkit config") {
        Ok(bytes) => match std::str::from_utf8(&bytes) {
            Ok(text) => parse_key(text, key),
            Err(_) => Says::Bad("is not UTF-8".into()),
        },
        Err(e) => Says::Bad(format!("cannot be read ({e})")),
    }
}

/// The places the toolkit may read, in its order, from an environment (`env`): the
/// variable's file, `$XDG_CONFIG_HOME`'s, the GPU operator's, `/etc`'s. Relative or empty
/// values are skipped (the toolkit would resolve them against a directory devgate does not
/// know); each path once.
pub fn candidates(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut out: Vec<PathBuf> = Vec::new();
    let all = [
        set("NVIDIA_CTK_CONFIG_FILE_PATH"),
        set("XDG_CONFIG_HOME").map(|d| d.join(RELATIVE)),
        Some(Path::new(OPERATOR_ROOT).join(".config").join(RELATIVE)),
        Some(Path::new(ETC_ROOT).join(RELATIVE)),
    ];
    for p in all.into_iter().flatten() {
        if p.is_absolute() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// `explicit` (`nvidia_toolkit_config`) alone when set, else every candidate.
pub fn reading(explicit: Option<&Path>, candidates: &[PathBuf]) -> Reading {
    match explicit {
        Some(p) => Reading {
            explicit: true,
            files: vec![(p.to_path_buf(), read(p))],
        },
        None => Reading {
            explicit: false,
            files: candidates.iter().map(|p| (p.clone(), read(p))).collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Says {
        parse_key(text, KEY)
    }

    #[test]
    fn only_the_top_level_key_counts() {
        assert_eq!(parse(&format!("{KEY} = false\n")), Says::Key(false));
        assert_eq!(parse(&format!("\"{KEY}\" = true\n")), Says::Key(true));
        assert_eq!(
            parse(&format!("[nvidia-container-cli]\n{KEY} = false\n")),
            Says::Unset
        );
        assert_eq!(
            parse(&format!("nvidia-container-cli.{KEY} = false\n")),
            Says::Unset
        );
        assert_eq!(parse("# nothing\n"), Says::Unset);
    }

    /// The toolkit fails to load such files; devgate reads them as selecting and says why.
    #[test]
    fn malformed_or_mistyped_reads_as_selecting_with_one_warning() {
        for text in [
            format!("{KEY} = \"false\"\n"),
            format!("{KEY} = false\n{KEY} = false\n"),
            format!("{KEY} = false\n[x\n"),
        ] {
            let s = parse(&text);
            assert!(matches!(s, Says::Bad(_)), "{text:?}: {s:?}");
            let r = Reading {
                explicit: true,
                files: vec![("/t.toml".into(), s)],
            };
            assert!(r.env_selectors(), "{text:?}");
            let w = r.warning().unwrap();
            assert!(
                w.starts_with("devgate: warning: NVIDIA toolkit config /t.toml"),
                "{w}"
            );
            assert!(!w.contains('\n'), "{w}");
        }
    }

    #[test]
    fn swarm_resource_names_are_split_and_trimmed_as_the_toolkit_does() {
        assert_eq!(
            swarm_resource("swarm-resource = \" DOCKER_RESOURCE_GPU, ,GPUS\"\n"),
            ["DOCKER_RESOURCE_GPU", "GPUS"]
        );
        assert!(swarm_resource("#swarm-resource = \"DOCKER_RESOURCE_GPU\"\n").is_empty());
        assert!(swarm_resource("[x]\nswarm-resource = \"GPUS\"\n").is_empty());
        assert!(swarm_resource("swarm-resource = 1\n").is_empty());
    }

    #[test]
    fn false_only_when_every_file_present_says_false() {
        let r = |files: &[Says]| Reading {
            explicit: false,
            files: files
                .iter()
                .enumerate()
                .map(|(i, s)| (PathBuf::from(format!("/{i}")), s.clone()))
                .collect(),
        };
        assert!(r(&[]).env_selectors());
        assert!(r(&[Says::Absent, Says::Absent]).env_selectors());
        assert!(!r(&[Says::Absent, Says::Key(false)]).env_selectors());
        assert!(!r(&[Says::Key(false), Says::Key(false)]).env_selectors());
        assert!(r(&[Says::Key(false), Says::Unset]).env_selectors());
        assert!(r(&[Says::Key(false), Says::Key(true)]).disagreeing());
        assert!(!r(&[Says::Key(false), Says::Absent]).disagreeing());
        assert!(!r(&[Says::Unset, Says::Key(true)]).disagreeing());
    }

    #[test]
    fn candidates_follow_the_toolkit_order() {
        let env = |k: &str| match k {
            "NVIDIA_CTK_CONFIG_FILE_PATH" => Some("/o/c.toml".into()),
            "XDG_CONFIG_HOME" => Some("/x".into()),
            _ => None,
        };
        assert_eq!(
            candidates(&env),
            [
                PathBuf::from("/o/c.toml"),
                "/x/nvidia-container-runtime/config.toml".into(),
                "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml".into(),
                "/etc/nvidia-container-runtime/config.toml".into(),
            ]
        );
        let relative = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "rel".into());
        assert_eq!(candidates(&relative).len(), 2);
        let etc = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "/etc".into());
        assert_eq!(candidates(&etc).len(), 2, "each path once");
    }

    /// `accept-nvidia-visible-devices-as-volume-mounts` is false unless every file there
    /// sets it true: absent files, an unset key and a bad file keep the toolkit's default.
    #[test]
    fn volume_mounts_only_where_every_file_there_sets_it() {
        let dir = crate::fsutil::tests::tempdir("toolkit-mounts");
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let on = file("on.toml", &format!("{MOUNTS_KEY} = true\n"));
        let off = file("off.toml", &format!("{MOUNTS_KEY} = false\n"));
        let unset = file("unset.toml", &format!("{KEY} = false\n"));
        let bad = file("bad.toml", &format!("{MOUNTS_KEY} = \"true\"\n"));
        let none = dir.join("none.toml");
        assert!(volume_mounts(Some(&on), &[]));
        assert!(volume_mounts(None, &[none.clone(), on.clone()]));
        assert!(!volume_mounts(None, &[]));
        assert!(!volume_mounts(None, std::slice::from_ref(&none)));
        for p in [&off, &unset, &bad] {
            assert!(!volume_mounts(Some(p), &[]), "{}", p.display());
            assert!(
                !volume_mounts(None, &[on.clone(), p.clone()]),
                "{}",
                p.display()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlinked_or_absent_file_is_read_safely() {
        let dir = crate::fsutil::tests::tempdir("toolkit-read");
        assert_eq!(read(&dir.join("none.toml")), Says::Absent);
        let real = dir.join("real.toml");
        std::fs::write(&real, format!("{KEY} = false\n")).unwrap();
        assert_eq!(read(&real), Says::Key(false));
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(
            matches!(read(&link), Says::Bad(_)),
            "a symlink is not followed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
