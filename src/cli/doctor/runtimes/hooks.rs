//! oci-hooks(5) files, read by CRI-O and podman: does one run devgate at start and at
//! poststop, for every container?

use super::files::{read_small, MAX_HOOK_FILES};
use crate::cli::doctor::error::{ConfigError, HooksNotWired};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------
// oci-hooks(5) files, read by CRI-O and podman.

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct OciHooksFile {
    /// Required by oci-hooks(5); a file without it is not read by the runtimes either.
    #[allow(dead_code)]
    pub(crate) version: String,
    pub(crate) hook: HookCmd,
    #[serde(default)]
    pub(crate) when: When,
    #[serde(default)]
    pub(crate) stages: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct HookCmd {
    pub(crate) path: PathBuf,
    #[serde(default)]
    pub(crate) args: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct When {
    pub(crate) always: Option<bool>,
    pub(crate) annotations: Option<BTreeMap<String, String>>,
    pub(crate) commands: Option<Vec<String>>,
    #[serde(rename = "hasBindMounts")]
    pub(crate) has_bind_mounts: Option<bool>,
}

impl When {
    /// oci-hooks(5) ANDs the conditions: only `always: true` alone matches every container.
    fn matches_all(&self) -> bool {
        self.always == Some(true)
            && self.annotations.as_ref().map_or(true, |a| a.is_empty())
            && self.commands.as_ref().map_or(true, |c| c.is_empty())
            && self.has_bind_mounts.is_none()
    }
}

/// One `*.json` file from a hooks directory.
#[derive(Debug, Clone)]
pub(crate) struct HookFile {
    pub(crate) path: PathBuf,
    pub(crate) parsed: Result<OciHooksFile, ConfigError>,
}

/// Reads every `*.json` in `dirs`; a file in a later directory replaces the one with the
/// same name in an earlier directory, as CRI-O's and podman's hook managers do. A missing
/// directory reads as empty.
pub(crate) fn read_hook_dirs(dirs: &[PathBuf]) -> Vec<HookFile> {
    let mut by_name: BTreeMap<String, HookFile> = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .take(MAX_HOOK_FILES)
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let parsed = read_small(&path).and_then(|t| {
                serde_json::from_str::<OciHooksFile>(&t).map_err(|e| ConfigError::Json {
                    path: path.clone(),
                    msg: e.to_string(),
                })
            });
            by_name.insert(name, HookFile { path, parsed });
        }
    }
    by_name.into_values().collect()
}

/// The stages at which a container's start runs devgate's start check.
const START_STAGES: [&str; 2] = ["prestart", "createRuntime"];

pub(crate) fn runs_devgate_hook(
    path: &Path,
    args: &[String],
    is_devgate: &dyn Fn(&Path) -> bool,
) -> bool {
    is_devgate(path) && args.iter().any(|a| a == "hook")
}

/// Ok: which file runs devgate, for a ✓ line. Err: why the runtime is not wired.
/// Long because each way devgate's hooks fall short (none, unreadable, conditional, start
/// only, poststop only) has a message of its own.
pub(crate) fn judge_hook_files(
    files: &[HookFile],
    dirs: &[PathBuf],
    is_devgate: &dyn Fn(&Path) -> bool,
) -> Result<String, HooksNotWired> {
    let ours: Vec<(&HookFile, &OciHooksFile)> = files
        .iter()
        .filter_map(|f| f.parsed.as_ref().ok().map(|p| (f, p)))
        .filter(|(_, p)| runs_devgate_hook(&p.hook.path, &p.hook.args, is_devgate))
        .collect();
    if ours.is_empty() {
        let broken = files
            .iter()
            .filter(|f| f.path.to_string_lossy().contains("devgate"))
            .find_map(|f| f.parsed.as_ref().err());
        if let Some(e) = broken {
            return Err(HooksNotWired::Unreadable(e.clone()));
        }
        return Err(HooksNotWired::NoHook(dirs.to_vec()));
    }
    let mut start = None;
    let mut stop = None;
    let mut conditional = None;
    for (f, p) in &ours {
        if !p.when.matches_all() {
            conditional = Some(f.path.clone());
            continue;
        }
        if p.stages.iter().any(|s| START_STAGES.contains(&s.as_str())) {
            start.get_or_insert((f, p));
        }
        if p.stages.iter().any(|s| s == "poststop") {
            stop.get_or_insert((f, p));
        }
    }
    match (start, stop) {
        (Some((f, p)), Some((g, _))) => {
            let files = if f.path == g.path {
                f.path.display().to_string()
            } else {
                format!("{} and {}", f.path.display(), g.path.display())
            };
            Ok(format!(
                "{files} runs {} {} at start and poststop",
                p.hook.path.display(),
                hook_args(&p.hook.args)
            ))
        }
        (None, None) => Err(match conditional {
            Some(c) => HooksNotWired::Conditional(c),
            None => HooksNotWired::NoStage,
        }),
        (Some((f, _)), None) => Err(HooksNotWired::StartOnly(f.path.clone())),
        (None, Some((f, _))) => Err(HooksNotWired::StopOnly(f.path.clone())),
    }
}

/// A hook's arguments past argv[0], for messages.
fn hook_args(args: &[String]) -> String {
    args.iter().skip(1).cloned().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devgate_at(p: &'static str) -> impl Fn(&Path) -> bool {
        move |x: &Path| x == Path::new(p)
    }

    fn file(path: &str, json: &str) -> HookFile {
        HookFile {
            path: path.into(),
            parsed: serde_json::from_str(json).map_err(|e| ConfigError::Json {
                path: path.into(),
                msg: e.to_string(),
            }),
        }
    }

    #[test]
    fn hook_files_wired_and_not() {
        let dg = devgate_at("/usr/bin/devgate");
        let dirs = vec![PathBuf::from("/h1"), PathBuf::from("/h2")];
        let good = file(
            "/h2/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","auto"]},
               "when":{"always":true},"stages":["prestart","poststop"]}"#,
        );
        assert_eq!(
            judge_hook_files(std::slice::from_ref(&good), &dirs, &dg).unwrap(),
            "/h2/devgate.json runs /usr/bin/devgate hook auto at start and poststop"
        );
        let e = judge_hook_files(&[], &dirs, &dg).unwrap_err();
        assert_eq!(e, HooksNotWired::NoHook(dirs.clone()));
        assert_eq!(e.to_string(), "no hook in /h1, /h2 runs devgate");
        let other = file(
            "/h1/x.json",
            r#"{"version":"1.0.0","hook":{"path":"/bin/true"},"when":{"always":true},"stages":["prestart"]}"#,
        );
        assert!(judge_hook_files(&[other], &dirs, &dg).is_err());
        let pre_only = file(
            "/h1/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","prestart"]},
               "when":{"always":true},"stages":["prestart"]}"#,
        );
        let e = judge_hook_files(&[pre_only], &dirs, &dg).unwrap_err();
        assert_eq!(e, HooksNotWired::StartOnly("/h1/devgate.json".into()));
        assert_eq!(
            e.to_string(),
            "/h1/devgate.json runs devgate at start but not at poststop (exit reasons and spare \
             leases need it)"
        );
        let conditional = file(
            "/h1/devgate.json",
            r#"{"version":"1.0.0","hook":{"path":"/usr/bin/devgate","args":["devgate","hook","auto"]},
               "when":{"always":true,"commands":["sh"]},"stages":["prestart","poststop"]}"#,
        );
        assert_eq!(
            judge_hook_files(&[conditional], &dirs, &dg)
                .unwrap_err()
                .to_string(),
            "/h1/devgate.json runs devgate only for containers matching its `when` (devgate \
             needs {\"always\": true} alone)"
        );
        let broken = file("/h1/devgate.json", "{");
        let e = judge_hook_files(&[broken], &dirs, &dg).unwrap_err();
        assert!(matches!(e, HooksNotWired::Unreadable(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("cannot read a devgate hook file: /h1/devgate.json: "),
            "{e}"
        );
    }
}
