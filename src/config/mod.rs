//! devgate's own configuration: one JSON file, every key optional. A missing default file
//! means built-in defaults; a file named explicitly must exist; unknown keys are errors,
//! because a misspelt policy key silently ignored is the worst surprise on a node.

pub mod policy;
pub mod toolkit;
pub mod xid;

use crate::error::{Error, Result};
use crate::fsutil::read_regular_file;
use crate::model::class::{self, ClassRule};
use policy::Policy;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub const DEFAULT_PATH: &str = "/etc/devgate/config.json";
pub const ENV_CONFIG: &str = "DEVGATE_CONFIG";
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Runtimes give a hook some seconds in all; a probe deadline past a minute is a typo.
const MAX_PROBE_TIMEOUT_MS: u64 = 60_000;
/// The default of `cluster_taints_max_age_s`: past it the hook takes the node agent's
/// taints file for stale.
pub const CLUSTER_TAINTS_MAX_AGE_S: u64 = 300;
/// How often the agent rewrites a taints file whose taints have not changed, after a
/// successful read of the cluster: its `written_unix` says when they were last seen so.
pub const CLUSTER_TAINTS_REFRESH_S: u64 = 60;
/// The bounds of `cluster_taints_max_age_s`: at least two of the agent's refreshes, at
/// most a day.
const MIN_TAINTS_AGE_S: u64 = 2 * CLUSTER_TAINTS_REFRESH_S;
const MAX_TAINTS_AGE_S: u64 = 86_400;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub state_dir: PathBuf,
    pub quarantine_dir: PathBuf,
    pub sysfs_root: PathBuf,
    pub dev_root: PathBuf,
    /// procfs, for the NVIDIA driver's list of GPUs (`driver/nvidia/gpus`).
    pub proc_root: PathBuf,
    /// NVIDIA container toolkit's config, for the default of `gpu.env_selectors`; unset,
    /// every file the toolkit may read ([`toolkit::candidates`]).
    pub nvidia_toolkit_config: Option<PathBuf>,
    pub log_file: Option<PathBuf>,
    #[serde(deserialize_with = "object")]
    pub policy: Policy,
    /// class → host device paths held back as spares.
    pub spares: BTreeMap<String, Vec<PathBuf>>,
    /// Extra class rules, tried before the built-in table.
    #[serde(deserialize_with = "objects")]
    pub device_classes: Vec<ClassRule>,
    /// The NVML library devgate opens, only for containers with NVIDIA devices.
    pub nvml_library: PathBuf,
    /// Deadline for a probe that can block (NVML on a dying GPU).
    pub probe_timeout_ms: u64,
    /// The kernel log, read for NVIDIA XID reports.
    pub kmsg_path: PathBuf,
    #[serde(deserialize_with = "object")]
    pub gpu: GpuConfig,
    /// Only termination-message files under this directory are ever written.
    pub kubelet_pods_dir: PathBuf,
    /// Only container log files under this directory are ever appended to.
    pub kubelet_pod_logs_dir: PathBuf,
    /// How many exit records state_dir/exits keeps.
    pub exits_keep: usize,
    /// Past this age (its `written_unix`) the node agent's cluster taints file is stale:
    /// each GPU's cluster verdict is then unknown (`policy.on_unknown`).
    pub cluster_taints_max_age_s: u64,
    /// The runtime `devgate runtime` (the OCI runtime wrapper) runs once it has decided.
    #[serde(deserialize_with = "object")]
    pub runtime: RuntimeConfig,
    /// Where this config came from, for messages; not a key.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// A section of the config (`policy`, `gpu`, `runtime`) read from a JSON object only. serde
/// also reads a struct from an array, field by field in declaration order: `"policy":
/// ["remap"]` would set `policy.default` without naming it.
fn object<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Object<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            map: A,
        ) -> std::result::Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Object(std::marker::PhantomData))
}

/// A list of [`object`]s: `device_classes` entries, which serde would also read from arrays.
fn objects<'de, D, T>(d: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Obj<T>(T);
    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            object(d).map(Obj)
        }
    }
    Ok(Vec::<Obj<T>>::deserialize(d)?
        .into_iter()
        .map(|o| o.0)
        .collect())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: "/run/devgate".into(),
            quarantine_dir: "/var/lib/devgate/quarantine".into(),
            sysfs_root: "/sys".into(),
            dev_root: "/dev".into(),
            proc_root: "/proc".into(),
            nvidia_toolkit_config: None,
            log_file: None,
            policy: Policy::default(),
            spares: BTreeMap::new(),
            device_classes: Vec::new(),
            nvml_library: "libnvidia-ml.so.1".into(),
            probe_timeout_ms: 2000,
            kmsg_path: "/dev/kmsg".into(),
            gpu: GpuConfig::default(),
            kubelet_pods_dir: "/var/lib/kubelet/pods".into(),
            kubelet_pod_logs_dir: "/var/log/pods".into(),
            exits_keep: 1000,
            cluster_taints_max_age_s: CLUSTER_TAINTS_MAX_AGE_S,
            runtime: RuntimeConfig::default(),
            source: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Volatile uncorrectable ECC errors above this make a GPU unhealthy.
    pub max_volatile_uncorrectable_ecc: u64,
    /// XID number (as a string key) → "unhealthy" | "warn" | "ignore", over the built-in table.
    pub xid_actions: BTreeMap<String, String>,
    /// Whether `NVIDIA_VISIBLE_DEVICES` selects GPUs; unset follows the NVIDIA toolkit.
    pub env_selectors: Option<bool>,
}

/// `runtime`: what the OCI runtime wrapper runs. `path` is an absolute path or a bare name
/// looked up in a fixed list of system directories (never the caller's PATH), so the
/// wrapper can sit in front of runc, crun or another wrapper (NVIDIA's runtime).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    pub path: PathBuf,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            path: "runc".into(),
        }
    }
}

impl Config {
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Config> {
        // serde reads a struct from a JSON array too, field by field in declaration order:
        // `[]` would be the defaults and `["/x"]` a state_dir, with no key named.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(Error::invalid(
                format!("config {}", path.display()),
                "the file is a JSON array; devgate's config is an object: {\"key\": value, ...}",
            ));
        }
        let mut c: Config =
            serde_json::from_slice(bytes).map_err(|e| Error::json("config", Some(path), &e))?;
        c.source = Some(path.to_path_buf());
        c.validate(path)?;
        Ok(c)
    }

    /// `explicit` is `--config`; else DEVGATE_CONFIG; else the default path, which may be absent.
    pub fn load(explicit: Option<&Path>) -> Result<Config> {
        let env = std::env::var_os(ENV_CONFIG).filter(|v| !v.is_empty());
        let (path, required) = match (explicit, env) {
            (Some(p), _) => (p.to_path_buf(), true),
            (None, Some(e)) => (PathBuf::from(e), true),
            (None, None) => (PathBuf::from(DEFAULT_PATH), false),
        };
        match read_regular_file(&path, MAX_CONFIG_BYTES, "config") {
            Ok(bytes) => Config::parse(&bytes, &path),
            Err(Error::Io { source, .. })
                if !required && source.kind() == io::ErrorKind::NotFound =>
            {
                Ok(Config::default())
            }
            Err(e) => Err(e),
        }
    }

    /// `gpu.env_selectors`, else what the NVIDIA toolkit's config says
    /// ([`Config::toolkit_reading`]).
    pub fn env_selectors(&self) -> bool {
        self.env_selectors_warned().0
    }

    /// [`Config::env_selectors`] with the warning line for a toolkit config devgate could
    /// not read as the toolkit does (which it then takes as selecting).
    pub fn env_selectors_warned(&self) -> (bool, Option<String>) {
        match self.gpu.env_selectors {
            Some(b) => (b, None),
            None => {
                let r = self.toolkit_reading();
                (r.env_selectors(), r.warning())
            }
        }
    }

    /// The NVIDIA toolkit's `accept-nvidia-visible-devices-as-volume-mounts`, read where
    /// [`Config::toolkit_reading`] reads: true only where every file there sets it.
    pub fn toolkit_volume_mounts(&self) -> bool {
        let candidates = toolkit::candidates(&|k| std::env::var_os(k));
        toolkit::volume_mounts(self.nvidia_toolkit_config.as_deref(), &candidates)
    }

    /// The NVIDIA toolkit's `accept-nvidia-visible-devices-envvar-when-unprivileged`, from
    /// `nvidia_toolkit_config`, else from every file the toolkit may read (this process's
    /// environment names some: runc's, the toolkit's own when NVIDIA's runtime ran it).
    pub fn toolkit_reading(&self) -> toolkit::Reading {
        let candidates = toolkit::candidates(&|k| std::env::var_os(k));
        toolkit::reading(self.nvidia_toolkit_config.as_deref(), &candidates)
    }

    /// Checks the loaded values; the first bad one is the error, naming its key. The
    /// checks run in the order of the rules' list, each an early return.
    fn validate(&self, path: &Path) -> Result<()> {
        let what = format!("config {}", path.display());
        self.check_absolute_paths(&what)?;
        self.check_program_paths(&what)?;
        if !(1..=MAX_PROBE_TIMEOUT_MS).contains(&self.probe_timeout_ms) {
            return Err(Error::invalid(
                &what,
                format!(
                    "probe_timeout_ms {} out of range 1-{MAX_PROBE_TIMEOUT_MS}",
                    self.probe_timeout_ms
                ),
            ));
        }
        if !(MIN_TAINTS_AGE_S..=MAX_TAINTS_AGE_S).contains(&self.cluster_taints_max_age_s) {
            return Err(Error::invalid(
                &what,
                format!(
                    "cluster_taints_max_age_s {} out of range \
                     {MIN_TAINTS_AGE_S}-{MAX_TAINTS_AGE_S}",
                    self.cluster_taints_max_age_s
                ),
            ));
        }
        xid::XidTable::new(&self.gpu.xid_actions)
            .map_err(|e| Error::invalid(&what, e.to_string()))?;
        self.check_class_names(&what)?;
        self.check_class_rules(&what)
    }

    /// Every path devgate reads or writes is absolute: the directories, the files set, and
    /// every spare.
    fn check_absolute_paths(&self, what: &str) -> Result<()> {
        for (key, p) in [
            ("state_dir", &self.state_dir),
            ("quarantine_dir", &self.quarantine_dir),
            ("sysfs_root", &self.sysfs_root),
            ("dev_root", &self.dev_root),
            ("proc_root", &self.proc_root),
            ("kmsg_path", &self.kmsg_path),
            ("kubelet_pods_dir", &self.kubelet_pods_dir),
            ("kubelet_pod_logs_dir", &self.kubelet_pod_logs_dir),
        ] {
            if !p.is_absolute() {
                return Err(Error::invalid(
                    what,
                    format!("{key} {p:?} is not an absolute path"),
                ));
            }
        }
        for (key, p) in [
            ("log_file", &self.log_file),
            ("nvidia_toolkit_config", &self.nvidia_toolkit_config),
        ] {
            if let Some(p) = p.as_ref().filter(|p| !p.is_absolute()) {
                return Err(Error::invalid(
                    what,
                    format!("{key} {p:?} is not an absolute path"),
                ));
            }
        }
        for (class, paths) in &self.spares {
            for p in paths {
                if !p.is_absolute() {
                    return Err(Error::invalid(
                        what,
                        format!("spares.{class}: {p:?} is not an absolute path"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The programs devgate loads or runs, `nvml_library` and `runtime.path`: each an
    /// absolute path or a bare name.
    fn check_program_paths(&self, what: &str) -> Result<()> {
        if !absolute_or_bare(&self.nvml_library) {
            // A relative path would be resolved against whatever directory the runtime
            // runs hooks in; a bare name goes through the loader's own search path.
            return Err(Error::invalid(
                what,
                format!(
                    "nvml_library {:?} must be an absolute path or a bare library name",
                    self.nvml_library
                ),
            ));
        }
        if !absolute_or_bare(&self.runtime.path) {
            // A relative path would name whatever the shim's working directory holds.
            return Err(Error::invalid(
                what,
                format!(
                    "runtime.path {:?} must be an absolute path or a bare command name",
                    self.runtime.path
                ),
            ));
        }
        Ok(())
    }

    /// Every rule in `device_classes` matches something: a major or a path.
    fn check_class_rules(&self, what: &str) -> Result<()> {
        for r in &self.device_classes {
            if r.major.is_none() && r.path.is_none() {
                return Err(Error::invalid(
                    what,
                    format!(
                        "device_classes: class {:?} needs a major or a path",
                        r.class
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every class `policy.classes` and `spares` name is one a rule gives (built-in or
    /// `device_classes`), or the `char`/`block` fallback: a misspelt class would otherwise
    /// be a policy that never applies, as silent as a misspelt key.
    fn check_class_names(&self, what: &str) -> Result<()> {
        // Every hook loads the config: build the rule table only when a class is named
        // (the packaged config names none).
        if self.policy.classes.is_empty() && self.spares.is_empty() {
            return Ok(());
        }
        let rules = self.class_rules();
        let known =
            |name: &str| matches!(name, "char" | "block") || rules.iter().any(|r| r.class == name);
        let named = self
            .policy
            .classes
            .keys()
            .map(|c| ("policy.classes", c))
            .chain(self.spares.keys().map(|c| ("spares", c)));
        for (key, class) in named {
            if !known(class) {
                let mut all: Vec<&str> = rules.iter().map(|r| r.class.as_str()).collect();
                all.extend(["char", "block"]);
                all.dedup();
                return Err(Error::invalid(
                    what,
                    format!(
                        "{key}: {class:?} is not a device class; the classes are {} \
                         (more with device_classes)",
                        all.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The operator's rules first, then the built-in table.
    pub fn class_rules(&self) -> Vec<ClassRule> {
        let mut rules = self.device_classes.clone();
        rules.extend(class::builtin());
        rules
    }
}

/// A path that is absolute, or a bare name with no `/` (found through a search path);
/// not empty.
fn absolute_or_bare(p: &Path) -> bool {
    let s = p.as_os_str();
    !s.is_empty() && (p.is_absolute() || !s.as_encoded_bytes().contains(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_gives_defaults() {
        let c = Config::parse(b"{}", Path::new("/c.json")).unwrap();
        assert_eq!(c.state_dir, Path::new("/run/devgate"));
        assert_eq!(c.quarantine_dir, Path::new("/var/lib/devgate/quarantine"));
        assert_eq!(c.dev_root, Path::new("/dev"));
        assert_eq!(c.sysfs_root, Path::new("/sys"));
        assert!(c.log_file.is_none());
        assert_eq!(c.policy, Policy::default());
        assert_eq!(c.runtime.path, Path::new("runc"));
    }

    #[test]
    fn malformed_file_names_file_and_position() {
        let e = Config::parse(
            b"{\n \"policy\": {\"default\": }\n}",
            Path::new("/etc/devgate/config.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("config /etc/devgate/config.json: line 2 column"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_and_relative_paths_are_errors() {
        let e = Config::parse(br#"{"stat_dir":"/x"}"#, Path::new("/c.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `stat_dir`"), "{e}");
        let e = Config::parse(br#"{"dev_root":"dev"}"#, Path::new("/c.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dev_root \"dev\" is not an absolute path"),
            "{e}"
        );
        let e = Config::parse(br#"{"kubelet_pod_logs_dir":"logs"}"#, Path::new("/c.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("kubelet_pod_logs_dir \"logs\" is not"), "{e}");
    }

    #[test]
    fn an_array_is_no_config() {
        for text in ["[]", " \n[\"/tmp/elsewhere\"]"] {
            let e = Config::parse(text.as_bytes(), Path::new("/c.json"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("config /c.json: the file is a JSON array; "),
                "{e}"
            );
        }
    }

    #[test]
    fn a_section_is_an_object_not_an_array() {
        for (text, column) in [
            (r#"{"policy": ["remap"]}"#, 11),
            (r#"{"gpu": [5]}"#, 8),
            (r#"{"runtime": ["/bin/x"]}"#, 12),
            (r#"{"device_classes": [["x", 240]]}"#, 20),
        ] {
            let e = Config::parse(text.as_bytes(), Path::new("/c.json"))
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!(
                    "config /c.json: line 1 column {column}: invalid type: sequence, \
                     expected an object"
                ),
            );
        }
        // objects still read as before, errors inside them keep their place and key
        let c = Config::parse(
            br#"{"policy": {"default": "warn"}, "runtime": {"path": "crun"}}"#,
            Path::new("/c.json"),
        )
        .unwrap();
        assert_eq!(c.policy.default, policy::Action::Warn);
        assert_eq!(c.runtime.path, Path::new("crun"));
        let e = Config::parse(br#"{"gpu": {"env_selector": true}}"#, Path::new("/c.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config /c.json: line 1 column 23: unknown field `env_selector`"),
            "{e}"
        );
    }

    #[test]
    fn policy_and_spares_name_known_classes_only() {
        let e = Config::parse(
            br#"{"policy": {"classes": {"nvidia_gpu": "remap"}}}"#,
            Path::new("/c.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "config /c.json: policy.classes: \"nvidia_gpu\" is not a device class; \
                 the classes are nvidia-ctl, nvidia-gpu, nvidia-uvm, nvidia-caps, dri, "
            ),
            "{e}"
        );
        assert!(
            e.ends_with(", char, block (more with device_classes)"),
            "{e}"
        );
        let e = Config::parse(
            br#"{"spares": {"gpu": ["/dev/nvidia7"]}}"#,
            Path::new("/c.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("spares: \"gpu\" is not a device class"), "{e}");
        // the built-in classes, the fallbacks and the operator's own classes are known
        Config::parse(
            br#"{"policy": {"classes": {"nvidia-gpu": "remap", "block": "warn", "char": "warn",
                 "fpga": "remap"}},
                 "spares": {"fpga": ["/dev/fpga1"], "char": ["/dev/x"]},
                 "device_classes": [{"class": "fpga", "major": 240}]}"#,
            Path::new("/c.json"),
        )
        .unwrap();
    }

    #[test]
    fn gpu_keys_are_validated() {
        let c = Config::parse(
            br#"{"nvml_library":"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1","probe_timeout_ms":500,
                 "gpu":{"max_volatile_uncorrectable_ecc":3,"xid_actions":{"79":"warn","31":"unhealthy"}}}"#,
            Path::new("/c.json"),
        )
        .unwrap();
        assert_eq!(c.probe_timeout_ms, 500);
        assert_eq!(c.gpu.max_volatile_uncorrectable_ecc, 3);
        assert_eq!(
            Config::default().nvml_library,
            Path::new("libnvidia-ml.so.1")
        );
        for (bad, says) in [
            (
                r#"{"nvml_library":"lib/libnvidia-ml.so"}"#,
                "must be an absolute path or a bare library name",
            ),
            (r#"{"nvml_library":""}"#, "must be an absolute path"),
            (
                r#"{"probe_timeout_ms":0}"#,
                "probe_timeout_ms 0 out of range 1-60000",
            ),
            (
                r#"{"cluster_taints_max_age_s":60}"#,
                "cluster_taints_max_age_s 60 out of range 120-86400",
            ),
            (
                r#"{"gpu":{"xid_actions":{"79":"panic"}}}"#,
                "gpu.xid_actions.79: \"panic\" is not one of",
            ),
            (
                r#"{"gpu":{"xid_actions":{"seventy":"warn"}}}"#,
                "is not an XID number",
            ),
            (r#"{"gpu":{"max_ecc":1}}"#, "unknown field `max_ecc`"),
            (
                r#"{"runtime":{"path":"bin/runc"}}"#,
                "runtime.path \"bin/runc\" must be an absolute path or a bare command name",
            ),
            (r#"{"runtime":{"path":""}}"#, "must be an absolute path"),
            (r#"{"runtime":{"bin":"runc"}}"#, "unknown field `bin`"),
        ] {
            let e = Config::parse(bad.as_bytes(), Path::new("/c.json"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn explicit_missing_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/devgate.json")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot open config /nonexistent/devgate.json"),
            "{e}"
        );
    }

    #[test]
    fn full_example_parses() {
        let c = Config::parse(
            br#"{"state_dir":"/run/devgate","quarantine_dir":"/var/lib/devgate/quarantine",
                 "sysfs_root":"/sys","dev_root":"/dev","log_file":"/var/log/devgate.jsonl",
                 "policy":{"default":"reject","classes":{"nvidia-gpu":"remap","block":"warn"},"on_unknown":"allow"},
                 "spares":{"nvidia-gpu":["/dev/nvidia7"]},
                 "device_classes":[{"class":"fpga","type":"c","major":240,"accelerator":true}]}"#,
            Path::new("/c.json"),
        )
        .unwrap();
        assert_eq!(c.class_rules()[0].class, "fpga");
        assert_eq!(c.spares["nvidia-gpu"].len(), 1);
    }
}

#[cfg(test)]
mod env_selector_tests {
    use super::*;

    #[test]
    fn env_selectors_follow_the_key_then_the_toolkit_then_true() {
        let dir = crate::fsutil::tests::tempdir("toolkit");
        let toolkit = dir.join("config.toml");
        let mut c = Config {
            nvidia_toolkit_config: Some(toolkit.clone()),
            ..Config::default()
        };
        assert!(c.env_selectors(), "no toolkit config: true");
        std::fs::write(
            &toolkit,
            "disable-require = false\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n",
        )
        .unwrap();
        assert!(!c.env_selectors(), "the toolkit says false");
        c.gpu.env_selectors = Some(true);
        assert!(c.env_selectors(), "the key wins");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod toolkit_toml_tests {
    use super::*;

    /// The toolkit reads its file as TOML: a key under `[nvidia-container-cli]` is that
    /// table's, not the top-level switch, which stays at its default (true) for the toolkit.
    #[test]
    fn a_key_under_a_table_does_not_turn_env_selectors_off() {
        let dir = crate::fsutil::tests::tempdir("toolkit-table");
        let toolkit = dir.join("config.toml");
        std::fs::write(
            &toolkit,
            "disable-require = false\n[nvidia-container-cli]\n\
             accept-nvidia-visible-devices-envvar-when-unprivileged = false\n",
        )
        .unwrap();
        let c = Config {
            nvidia_toolkit_config: Some(toolkit.clone()),
            ..Config::default()
        };
        assert!(
            c.env_selectors(),
            "the table's key is not the top-level one"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
