//! containerd: is the default runtime of its CRI plugin (and each other runc runtime) wired
//! to devgate, by a complete base runtime spec whose hooks run devgate or by a binary that
//! is devgate's runtime wrapper?

use super::binary::Binary;
use super::files::{one_line_toml, toml_error};
use super::hooks::runs_devgate_hook;
use crate::cli::doctor::error::{ConfigError, RuntimeNotWired};
use crate::cli::doctor::options::FixCmd;
use crate::cli::hooks_config::NODE_WIDE_SETTINGS;
use crate::cli::host_exec::{self as host, RunError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// containerd's dump is some tens of KiB; a runaway one is cut here.
const MAX_DUMP: u64 = 8 << 20;
/// `containerd config dump` loads plugins' configs only; seconds mean something is wrong.
const DUMP_DEADLINE: Duration = Duration::from_secs(20);

/// containerd's CRI runtime plugin: config version 3 (containerd 2.x) and version 2 (1.x).
pub(crate) const CRI_V3: &str = "io.containerd.cri.v1.runtime";
pub(crate) const CRI_V2: &str = "io.containerd.grpc.v1.cri";

// ---------------------------------------------------------------------------------------
// containerd: `containerd config dump` is the merged configuration (the file, its
// `imports` drop-ins, and the built-in defaults) in the daemon's own config version.

/// One runtime of containerd's CRI plugin, as the dump gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CriRuntime {
    pub(crate) runtime_type: String,
    pub(crate) base_runtime_spec: String,
    pub(crate) binary_name: String,
    pub(crate) systemd_cgroup: Option<bool>,
    /// The annotation patterns the CRI copies from kubelet's request into the spec.
    pub(crate) container_annotations: Vec<String>,
}

/// containerd's CRI runtime configuration, from the dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerdCri {
    pub(crate) version: i64,
    /// The plugin's table name (it differs between config versions).
    pub(crate) plugin: &'static str,
    /// The CRI plugin is disabled: kubelet cannot use this containerd.
    pub(crate) disabled: bool,
    pub(crate) default_runtime: String,
    pub(crate) runtimes: BTreeMap<String, CriRuntime>,
}

#[derive(Deserialize)]
struct Dump {
    version: Option<i64>,
    #[serde(default)]
    disabled_plugins: Vec<String>,
    #[serde(default)]
    plugins: BTreeMap<String, toml::Value>,
}

#[derive(Deserialize, Default)]
struct CriPlugin {
    #[serde(default)]
    containerd: CriContainerd,
}

#[derive(Deserialize, Default)]
struct CriContainerd {
    default_runtime_name: Option<String>,
    #[serde(default)]
    runtimes: BTreeMap<String, DumpRuntime>,
}

#[derive(Deserialize)]
struct DumpRuntime {
    #[serde(default)]
    runtime_type: String,
    #[serde(default)]
    base_runtime_spec: String,
    #[serde(default)]
    container_annotations: Vec<String>,
    options: Option<DumpRuncOptions>,
}

#[derive(Deserialize)]
struct DumpRuncOptions {
    #[serde(rename = "BinaryName", default)]
    binary_name: String,
    #[serde(rename = "SystemdCgroup")]
    systemd_cgroup: Option<bool>,
}

pub(crate) fn parse_containerd_dump(text: &str) -> Result<ContainerdCri, ConfigError> {
    let dump: Dump = toml::from_str(text).map_err(|e| toml_error(None, &e))?;
    let (version, plugin) = match dump.version {
        Some(3) => (3, CRI_V3),
        Some(2) => (2, CRI_V2),
        Some(v) => return Err(ConfigError::DumpVersion(v)),
        None => return Err(ConfigError::NoDumpVersion),
    };
    let disabled = dump
        .disabled_plugins
        .iter()
        .any(|p| p == "cri" || p == CRI_V2 || p == CRI_V3);
    let cri: CriPlugin = match dump.plugins.get(plugin) {
        Some(v) => v
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Plugin {
                plugin,
                msg: one_line_toml(&e),
            })?,
        None => CriPlugin::default(),
    };
    let runtimes = cri
        .containerd
        .runtimes
        .into_iter()
        .map(|(name, r)| {
            let (binary_name, systemd_cgroup) = match r.options {
                Some(o) => (o.binary_name, o.systemd_cgroup),
                None => (String::new(), None),
            };
            (
                name,
                CriRuntime {
                    runtime_type: r.runtime_type,
                    base_runtime_spec: r.base_runtime_spec,
                    binary_name,
                    systemd_cgroup,
                    container_annotations: r.container_annotations,
                },
            )
        })
        .collect();
    Ok(ContainerdCri {
        version,
        plugin,
        disabled,
        default_runtime: cri
            .containerd
            .default_runtime_name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "runc".into()),
        runtimes,
    })
}

/// Runs `containerd [--config FILE] config dump` with a deadline and a bound on its output
/// (`host_exec::output_within`).
pub(crate) fn containerd_dump(bin: &Path, config: Option<&Path>) -> Result<String, ConfigError> {
    containerd_dump_in(Path::new("/"), bin, config)
}

/// [`containerd_dump`] of the host whose root is at `root` (its containerd, run inside it,
/// with `bin` and `config` as the host names them): install-host reads what the host's
/// containerd makes of its config before restarting it.
pub(crate) fn containerd_dump_in(
    root: &Path,
    bin: &Path,
    config: Option<&Path>,
) -> Result<String, ConfigError> {
    let failed = |run: RunError| ConfigError::DumpRun {
        bin: bin.to_path_buf(),
        run,
    };
    let mut cmd = Command::new(bin);
    host::run_inside(&mut cmd, root).map_err(failed)?;
    // The daemon's working directory (systemd's default): containerd 1.x globs a relative
    // `imports` entry from there, so the dump must read the drop-ins the daemon reads.
    cmd.current_dir("/");
    if let Some(c) = config {
        // Named relative to doctor's directory, not the dump's.
        let c = match std::env::current_dir() {
            Ok(d) if c.is_relative() => d.join(c),
            _ => c.to_path_buf(),
        };
        cmd.arg("--config").arg(c);
    }
    cmd.args(["config", "dump"]);
    let out = host::output_within(cmd, DUMP_DEADLINE, MAX_DUMP).map_err(failed)?;
    String::from_utf8(out).map_err(|_| ConfigError::DumpNotUtf8)
}

/// What a base runtime spec file holds, as far as devgate cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BaseSpec {
    NotSet,
    Unreadable(ConfigError),
    /// Keys a complete spec has and this one lacks.
    Incomplete(Vec<&'static str>),
    /// Settings the CRI clears on the spec it generates, which a base spec gives every
    /// container on the node instead (process.rlimits, seccomp, AppArmor).
    NodeWide(Vec<&'static str>),
    Complete {
        start: bool,
        stop: bool,
    },
}

#[derive(Deserialize)]
struct SpecShape {
    #[serde(rename = "ociVersion")]
    oci_version: Option<serde::de::IgnoredAny>,
    process: Option<serde::de::IgnoredAny>,
    root: Option<serde::de::IgnoredAny>,
    linux: Option<serde::de::IgnoredAny>,
    hooks: Option<oci_spec::runtime::Hooks>,
}

/// containerd reads the base spec once, at daemon start, and uses it whole as the start of
/// every container's spec: a file holding only hooks makes containers without a process,
/// root or namespaces.
pub(crate) fn examine_base_spec(text: &str, is_devgate: &dyn Fn(&Path) -> bool) -> BaseSpec {
    let shape: SpecShape = match serde_json::from_str(text) {
        Ok(s) => s,
        Err(e) => return BaseSpec::Unreadable(ConfigError::NotSpec(e.to_string())),
    };
    let missing: Vec<&'static str> = [
        ("ociVersion", shape.oci_version.is_some()),
        ("process", shape.process.is_some()),
        ("root", shape.root.is_some()),
        ("linux", shape.linux.is_some()),
    ]
    .into_iter()
    .filter(|(_, present)| !present)
    .map(|(k, _)| k)
    .collect();
    if !missing.is_empty() {
        return BaseSpec::Incomplete(missing);
    }
    let node_wide = node_wide_settings(text);
    if !node_wide.is_empty() {
        return BaseSpec::NodeWide(node_wide);
    }
    let runs = |hooks: Option<&Vec<oci_spec::runtime::Hook>>| {
        hooks.is_some_and(|hs| {
            hs.iter().any(|h| {
                runs_devgate_hook(h.path(), h.args().as_deref().unwrap_or(&[]), is_devgate)
            })
        })
    };
    match &shape.hooks {
        None => BaseSpec::Complete {
            start: false,
            stop: false,
        },
        Some(h) => {
            #[allow(deprecated)]
            let prestart = h.prestart().as_ref();
            BaseSpec::Complete {
                start: runs(prestart) || runs(h.create_runtime().as_ref()),
                stop: runs(h.poststop().as_ref()),
            }
        }
    }
}

/// The [`NODE_WIDE_SETTINGS`] a spec sets, as `object.key`.
fn node_wide_settings(text: &str) -> Vec<&'static str> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    NODE_WIDE_SETTINGS
        .iter()
        .zip([
            "process.rlimits",
            "process.apparmorProfile",
            "linux.seccomp",
        ])
        .filter(|((object, key), _)| v.get(object).and_then(|o| o.get(key)).is_some())
        .map(|(_, name)| name)
        .collect()
}

/// Why a base spec fails whatever the runtime's binary is (containerd uses the file whole
/// for every container), or None.
fn base_spec_error(name: &str, spec_path: &str, spec: &BaseSpec) -> Option<RuntimeNotWired> {
    let (name, spec_path) = (name.to_string(), spec_path.to_string());
    match spec {
        BaseSpec::Unreadable(e) => Some(RuntimeNotWired::Unreadable {
            name,
            spec_path,
            why: Box::new(e.clone()),
        }),
        BaseSpec::NodeWide(set) => Some(RuntimeNotWired::NodeWide {
            name,
            spec_path,
            set: set.clone(),
        }),
        BaseSpec::Incomplete(missing) => Some(RuntimeNotWired::Incomplete {
            name,
            spec_path,
            missing: missing.clone(),
        }),
        BaseSpec::NotSet | BaseSpec::Complete { .. } => None,
    }
}

/// The judgement on one containerd runtime: Ok(detail) or Err(why not wired).
pub(crate) fn judge_containerd_runtime(
    name: &str,
    rt: &CriRuntime,
    spec: &BaseSpec,
    binary: &Binary,
) -> Result<String, RuntimeNotWired> {
    let spec_path = &rt.base_runtime_spec;
    if let Some(e) = base_spec_error(name, spec_path, spec) {
        return Err(e);
    }
    let hooks = match spec {
        BaseSpec::Complete { start, stop } => Some((*start, *stop)),
        _ => None,
    };
    if binary.runs_devgate() {
        // The wrapper gates and remaps; only the poststop hook reports faults of a run.
        let note = match hooks {
            Some((_, true)) => "",
            _ => "; no base_runtime_spec hook runs devgate at poststop, so faults during a run go unreported",
        };
        return Ok(format!("runtime {name} {}{note}", binary.describe()));
    }
    let (name, spec_path) = (name.to_string(), spec_path.clone());
    match hooks {
        Some((true, true)) if binary.runs_crun() => Err(RuntimeNotWired::CrunHooksAlone {
            name,
            spec_path,
            binary: binary.describe(),
        }),
        Some((true, true)) => Ok(format!(
            "runtime {name} starts from {spec_path}, a complete spec whose hooks run devgate at \
             start and poststop"
        )),
        Some((true, false)) => Err(RuntimeNotWired::StartOnly { name, spec_path }),
        Some((false, true)) => Err(RuntimeNotWired::StopOnly { name, spec_path }),
        Some((false, false)) => Err(RuntimeNotWired::NoHook {
            name,
            spec_path,
            binary: binary.describe(),
        }),
        None => Err(RuntimeNotWired::NoBaseSpec {
            name,
            binary: binary.describe(),
        }),
    }
}

/// The annotation kubelet's terminationMessagePolicy reaches devgate's poststop through
/// (docs/poststop.md).
pub(crate) const POLICY_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePolicy";

/// Whether the runtime's CRI copies kubelet's policy annotation into the spec: one of its
/// `container_annotations` patterns matches it, as Go's path.Match (containerd's
/// getPassthroughAnnotations).
pub(crate) fn passes_policy(rt: &CriRuntime) -> bool {
    rt.container_annotations
        .iter()
        .any(|p| super::go_match::go_path_match(p, POLICY_ANNOTATION))
}

/// The fix line for an unwired containerd, or for one that runs crun with hooks alone.
pub(crate) fn containerd_fix(cri: &ContainerdCri, runtime: &str, fix: &FixCmd) -> String {
    let crun = cri.runtimes.get(runtime).is_some_and(|rt| {
        Path::new(&rt.binary_name)
            .file_name()
            .is_some_and(|n| n == "crun")
    });
    if crun {
        return format!(
            "{} --runtime containerd --wrapper --bin {} --out DIR, merge it (BinaryName = \
             devgate-runtime under [plugins.\"{}\".containerd.runtimes.{runtime}.options]), \
             set runtime.path to crun in devgate's config, restart containerd (keep the hooks)",
            fix.prefix,
            fix.bin.display(),
            cri.plugin
        );
    }
    format!(
        "{}, set base_runtime_spec = \"/etc/containerd/devgate-base-spec.json\" under \
         [plugins.\"{}\".containerd.runtimes.{runtime}], and restart containerd",
        fix.hooks_config("containerd", Path::new("/etc/containerd")),
        cri.plugin
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devgate_at(p: &'static str) -> impl Fn(&Path) -> bool {
        move |x: &Path| x == Path::new(p)
    }

    /// The shape containerd 2.x prints: config version 3 and the runtime plugin's table.
    const DUMP_V3: &str = r#"
version = 3
disabled_plugins = []
imports = ["/etc/containerd/conf.d/devgate.toml"]

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          base_runtime_spec = '/etc/containerd/devgate-base-spec.json'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            SystemdCgroup = true
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
            BinaryName = '/usr/bin/nvidia-container-runtime'
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
"#;

    #[test]
    fn containerd_dump_v3_and_v2() {
        let c = parse_containerd_dump(DUMP_V3).unwrap();
        assert_eq!(c.version, 3);
        assert_eq!(c.plugin, CRI_V3);
        assert!(!c.disabled);
        assert_eq!(c.default_runtime, "runc");
        let runc = &c.runtimes["runc"];
        assert_eq!(
            runc.base_runtime_spec,
            "/etc/containerd/devgate-base-spec.json"
        );
        assert_eq!(runc.systemd_cgroup, Some(true));
        assert_eq!(
            c.runtimes["nvidia"].binary_name,
            "/usr/bin/nvidia-container-runtime"
        );

        let v2 = r#"
version = 2
disabled_plugins = ["cri"]
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
"#;
        let c = parse_containerd_dump(v2).unwrap();
        assert_eq!((c.version, c.plugin, c.disabled), (2, CRI_V2, true));
        assert_eq!(c.default_runtime, "nvidia");
        assert_eq!(c.runtimes["runc"].base_runtime_spec, "");
        assert_eq!(c.runtimes["runc"].systemd_cgroup, None);

        let e = parse_containerd_dump("version = 1\n").unwrap_err();
        assert_eq!(e, ConfigError::DumpVersion(1));
        assert_eq!(
            e.to_string(),
            "config version 1 is not one devgate knows (2 or 3)"
        );
        assert!(parse_containerd_dump("version = [\n").is_err());
    }

    fn repo_file(p: &str) -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(p))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// The configs containerd writes (`containerd config default` of 1.6 on this host, of
    /// 2.x from containerd's docs): the CRI plugin found by the config version, runc the
    /// default runtime, no base spec, no BinaryName.
    #[test]
    fn containerd_defaults_of_1_6_and_2_x() {
        for (file, version, plugin) in [
            (
                "tests/fixtures/containerd/containerd-1.6-config-default.toml",
                2,
                CRI_V2,
            ),
            (
                "tests/fixtures/containerd/containerd-2.x-config-default.toml",
                3,
                CRI_V3,
            ),
        ] {
            let c = parse_containerd_dump(&repo_file(file)).unwrap();
            assert_eq!(
                (c.version, c.plugin, c.disabled),
                (version, plugin, false),
                "{file}"
            );
            assert_eq!(c.default_runtime, "runc", "{file}");
            let runc = &c.runtimes["runc"];
            assert_eq!(runc.runtime_type, "io.containerd.runc.v2", "{file}");
            assert_eq!(
                (runc.base_runtime_spec.as_str(), runc.binary_name.as_str()),
                ("", "")
            );
        }
    }

    /// Real dumps (tests/fixtures/containerd/README.md): each runtime's
    /// container_annotations, and whether they pass kubelet's policy annotation.
    #[test]
    fn container_annotations_from_real_dumps() {
        let c = parse_containerd_dump(&repo_file(
            "tests/fixtures/containerd/containerd-1.6-config-dump-annotations.toml",
        ))
        .unwrap();
        assert_eq!(
            c.runtimes["runc"].container_annotations,
            [POLICY_ANNOTATION]
        );
        assert!(passes_policy(&c.runtimes["runc"]));
        assert_eq!(
            c.runtimes["crun"].container_annotations,
            ["io.kubernetes.cri.*"]
        );
        assert!(!passes_policy(&c.runtimes["crun"]));
        let c = parse_containerd_dump(&repo_file(
            "tests/fixtures/containerd/containerd-2.1-config-dump-annotations.toml",
        ))
        .unwrap();
        assert_eq!(c.default_runtime, "crun");
        assert!(c.runtimes["crun"].container_annotations.is_empty());
        assert!(!passes_policy(&c.runtimes["crun"]));
        assert!(passes_policy(&c.runtimes["runc"]));
        // containerd's own defaults pass nothing.
        for f in [
            "tests/fixtures/containerd/containerd-2.1-config-dump.toml",
            "tests/fixtures/containerd/containerd-1.6-config-default.toml",
        ] {
            let c = parse_containerd_dump(&repo_file(f)).unwrap();
            assert!(!passes_policy(&c.runtimes["runc"]), "{f}");
        }
    }

    /// The shipped hook snippets, for config version 2 (containerd 1.x) and 3 (2.x), set
    /// the base spec the packages install under the plugin that version names.
    #[test]
    fn shipped_hook_snippets_for_both_config_versions() {
        for (file, version) in [
            ("hooks/containerd/config.toml", 2),
            ("hooks/containerd/config-v3.toml", 3),
        ] {
            let c = parse_containerd_dump(&repo_file(file)).unwrap();
            assert_eq!(c.version, version, "{file}");
            assert_eq!(
                c.runtimes["runc"].base_runtime_spec, "/etc/containerd/devgate-base-spec.json",
                "{file}"
            );
        }
    }

    #[test]
    fn base_spec_must_be_complete() {
        let dg = devgate_at("/usr/bin/devgate");
        let hooks = r#""hooks":{"prestart":[{"path":"/usr/bin/devgate","args":["devgate","hook","prestart"]}],
                       "poststop":[{"path":"/usr/bin/devgate","args":["devgate","hook","poststop"]}]}"#;
        assert_eq!(
            examine_base_spec(&format!("{{{hooks}}}"), &dg),
            BaseSpec::Incomplete(vec!["ociVersion", "process", "root", "linux"])
        );
        let full = format!(
            r#"{{"ociVersion":"1.1.0","process":{{"cwd":"/","user":{{"uid":0,"gid":0}}}},"root":{{"path":"rootfs"}},"linux":{{}},{hooks}}}"#
        );
        assert_eq!(
            examine_base_spec(&full, &dg),
            BaseSpec::Complete {
                start: true,
                stop: true
            }
        );
        let other = devgate_at("/opt/devgate");
        assert_eq!(
            examine_base_spec(&full, &other),
            BaseSpec::Complete {
                start: false,
                stop: false
            }
        );
        assert!(matches!(
            examine_base_spec("[]", &dg),
            BaseSpec::Unreadable(_)
        ));
    }

    /// containerd 1.6's own default spec (hooks/containerd/default-spec-containerd-1.6.json,
    /// what `ctr oci spec` prints) as a base spec caps every container at 1024 open files.
    #[test]
    fn base_spec_with_node_wide_settings_is_flagged() {
        let dg = devgate_at("/usr/bin/devgate");
        let ctr = include_str!("../../../../hooks/containerd/default-spec-containerd-1.6.json");
        assert_eq!(
            examine_base_spec(ctr, &dg),
            BaseSpec::NodeWide(vec!["process.rlimits"])
        );
        let mut v: serde_json::Value = serde_json::from_str(ctr).unwrap();
        v["process"]["apparmorProfile"] = "cri-containerd.apparmor.d".into();
        v["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO"});
        assert_eq!(
            examine_base_spec(&v.to_string(), &dg),
            BaseSpec::NodeWide(vec![
                "process.rlimits",
                "process.apparmorProfile",
                "linux.seccomp"
            ])
        );
        v["process"].as_object_mut().unwrap().remove("rlimits");
        v["process"]
            .as_object_mut()
            .unwrap()
            .remove("apparmorProfile");
        v["linux"].as_object_mut().unwrap().remove("seccomp");
        assert!(matches!(
            examine_base_spec(&v.to_string(), &dg),
            BaseSpec::Complete { .. }
        ));
        let rt = CriRuntime {
            runtime_type: "io.containerd.runc.v2".into(),
            base_runtime_spec: "/s.json".into(),
            ..Default::default()
        };
        let wrapper = Binary::DevgateWrapper("/usr/bin/devgate-runtime".into());
        let e = judge_containerd_runtime(
            "runc",
            &rt,
            &BaseSpec::NodeWide(vec!["process.rlimits"]),
            &wrapper,
        )
        .unwrap_err();
        assert!(matches!(e, RuntimeNotWired::NodeWide { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "runtime runc: base_runtime_spec /s.json sets process.rlimits, which every container \
             on the node then gets (containerd's CRI applies its own defaults only without a base \
             spec); remove them from the file and restart containerd"
        );
    }

    /// Long because each case is the same judge with one input changed (the spec, the
    /// binary); they read as a table.
    #[test]
    fn containerd_runtime_judgement() {
        let rt = CriRuntime {
            runtime_type: "io.containerd.runc.v2".into(),
            base_runtime_spec: "/s.json".into(),
            ..Default::default()
        };
        let ok = BaseSpec::Complete {
            start: true,
            stop: true,
        };
        assert!(judge_containerd_runtime("runc", &rt, &ok, &Binary::Default).is_ok());
        let wrapper = Binary::DevgateWrapper("/usr/bin/devgate-runc".into());
        assert_eq!(
            judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &wrapper).unwrap(),
            "runtime runc runs devgate's runtime wrapper /usr/bin/devgate-runc; no \
             base_runtime_spec hook runs devgate at poststop, so faults during a run go unreported"
        );
        assert_eq!(
            judge_containerd_runtime("runc", &rt, &ok, &wrapper).unwrap(),
            "runtime runc runs devgate's runtime wrapper /usr/bin/devgate-runc"
        );
        let misnamed = Binary::DevgateMisnamed("/usr/bin/devgate".into());
        let e = judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &misnamed)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("runs devgate as /usr/bin/devgate, which is the runtime wrapper only when named devgate-runtime (a link to devgate) or run as `devgate runtime`"),
            "{e}"
        );
        // An incomplete spec fails even with the wrapper: containerd would use it whole.
        let e = judge_containerd_runtime(
            "runc",
            &rt,
            &BaseSpec::Incomplete(vec!["process"]),
            &wrapper,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a complete spec (no process)"), "{e}");
        let e =
            judge_containerd_runtime("runc", &rt, &BaseSpec::NotSet, &Binary::Default).unwrap_err();
        assert_eq!(
            e,
            RuntimeNotWired::NoBaseSpec {
                name: "runc".into(),
                binary: "runs runc".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "runtime runc has no base_runtime_spec and runs runc"
        );
        let nv = Binary::Nvidia {
            path: "/usr/bin/nvidia-container-runtime".into(),
            runs: Ok("/usr/bin/runc".into()),
            runs_devgate: false,
        };
        let e = judge_containerd_runtime("nvidia", &rt, &BaseSpec::NotSet, &nv)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("which runs /usr/bin/runc"), "{e}");
        // crun with the hooks alone: the reject line never reaches kubelet.
        let crun = Binary::Other("/usr/bin/crun".into());
        let e = judge_containerd_runtime("runc", &rt, &ok, &crun)
            .unwrap_err()
            .to_string();
        assert!(e.contains("crun discards a hook's output"), "{e}");
        let nv_crun = Binary::Nvidia {
            path: "/usr/bin/nvidia-container-runtime".into(),
            runs: Ok("/usr/bin/crun".into()),
            runs_devgate: false,
        };
        assert!(judge_containerd_runtime("nvidia", &rt, &ok, &nv_crun).is_err());
        // crun behind the wrapper passes.
        assert!(judge_containerd_runtime("runc", &rt, &ok, &wrapper).is_ok());
        assert!(judge_containerd_runtime("runc", &rt, &ok, &nv).is_ok());
    }
}
