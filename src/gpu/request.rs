//! GPUs a container selects by name rather than by device node: `NVIDIA_VISIBLE_DEVICES`
//! and CDI annotations, and the `nvidiaN` nodes on the host.

use crate::discover::devnode::{find_host_node, node_num, walk_nodes};
use crate::model::class::{self, ClassRule, NVIDIA_MAJOR};
use crate::model::device::{DevNum, DevType, Device, Source};
use crate::oci::spec::Spec;
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::selector::parse as parse_selector;
pub use super::selector::GpuSelector;

pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Docker Swarm's generic resources (`DOCKER_RESOURCE_<KIND>`), the names the toolkit's
/// `swarm-resource` key is for (commented default `DOCKER_RESOURCE_GPU`): where the key
/// names a variable a container sets, the toolkit reads it instead of
/// `NVIDIA_VISIBLE_DEVICES`, under the same privilege rule. devgate does not read the
/// toolkit's config on every start to learn the names: it reads every variable of this
/// prefix (a pod that sets one only adds checks), and doctor fails a `swarm-resource`
/// naming another.
pub const SWARM_RESOURCE_PREFIX: &str = "DOCKER_RESOURCE_";
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The CDI kinds NVIDIA's specs name GPUs by: nvidia-ctk's, the device plugin's own
/// (`--device-list-strategy=cdi-annotations`/`cdi-cri`), the management spec's, and the
/// runtime's own `runtime.nvidia.com/gpu`, whose devices its CDI modes generate from the
/// name (`filterAutomaticDevices`, v1.17.0 on; the default kind of its `jit-cdi` mode,
/// the default mode since v1.18.0).
const CDI_GPU_KINDS: [&str; 4] = [
    "nvidia.com/gpu=",
    "k8s.device-plugin.nvidia.com/gpu=",
    "management.nvidia.com/gpu=",
    "runtime.nvidia.com/gpu=",
];

/// The GPU name in a CDI device name of one of [`CDI_GPU_KINDS`].
fn cdi_gpu_name(name: &str) -> Option<&str> {
    CDI_GPU_KINDS.iter().find_map(|k| name.strip_prefix(k))
}

/// The CDI library's `IsQualifiedName`: `vendor/class=name`, the vendor and class a letter,
/// then letters, digits, `_`, `-` or `.`, ending in a letter or digit, the name the same
/// with `:` too and starting with a letter or digit. ASCII only, as the library compares
/// bytes. A one-letter vendor or class panics the library (a slice `[1:0]`): the runtime
/// fails and hands over nothing, so it is taken as a qualified name (of no GPU kind) here.
fn qualified_cdi_name(device: &str) -> Option<(&str, &str)> {
    let (kind, name) = device.split_once('=')?;
    let (vendor, class) = kind.split_once('/')?;
    let inner = |b: &[u8], extra: &[u8]| {
        b[1..b.len() - 1]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    let kind_ok = |s: &str| {
        let b = s.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphabetic()
            && (b.len() == 1 || (b[b.len() - 1].is_ascii_alphanumeric() && inner(b, b"_-.")))
    };
    let n = name.as_bytes();
    let name_ok = !n.is_empty()
        && n[0].is_ascii_alphanumeric()
        && (n.len() == 1 || (n[n.len() - 1].is_ascii_alphanumeric() && inner(n, b"_-.:")));
    (kind_ok(vendor) && kind_ok(class) && name_ok).then_some((kind, name))
}

/// The GPU names in one device the toolkit hands on from an annotation or a mount. Its CDI
/// modes take a qualified name of NVIDIA's GPU kinds as that GPU, of another kind as no
/// GPU, and since v1.18.0 anything else as a name of the runtime's default kind
/// (`nvidia.com/gpu`, or `runtime.nvidia.com/gpu` in `jit-cdi` mode: `DeviceRequests` in
/// `internal/modifier/cdi.go`). Its hook joins the mounts' devices with commas for
/// nvidia-container-cli, which splits them again: so an unqualified device is read token
/// by token (an annotation's tokens hold no comma).
fn device_request_names(device: &str) -> impl Iterator<Item = &str> {
    let (qualified, names) = match qualified_cdi_name(device) {
        Some((kind, name)) => {
            let gpu = CDI_GPU_KINDS
                .iter()
                .any(|k| k.strip_suffix('=') == Some(kind));
            (gpu.then_some(name), None)
        }
        None => (None, Some(device.split(','))),
    };
    qualified.into_iter().chain(names.into_iter().flatten())
}

/// A bound on distinct selectors, so that memory stays bounded however long the values.
/// A spec the toolkit takes whole can pass it: a bus id no GPU has is a MIG device to the
/// cli (`0:0:00` … `0:3:ff` are 1024 spellings of four), and the device plugin's mounts
/// are read where the toolkit does not read them. So past it the rest is not read and is
/// [`GpuSelector::Unread`]: every GPU is judged as named, and the selectors that were not
/// read are one unknown. Never dropped: the GPU after them is the one the container gets.
pub(crate) const MAX_SELECTORS: usize = 1024;

/// The selectors read so far, without repeats: `1`, `01` and `+1` are one selector, and of
/// the tokens NVIDIA refuses only the first is kept (its tooling stops at it; one unknown
/// says so). Bounded by [`MAX_SELECTORS`] however long the spec's values are, and each
/// token costs one set lookup, so that millions of tokens cost only their parse. The set
/// is made at the first selector: a std hash set draws its keys from getrandom(2), one
/// system call every container without a GPU selector would pay for nothing.
#[derive(Default)]
struct Selectors {
    out: Vec<(GpuSelector, Source)>,
    seen: Option<HashSet<(GpuSelector, Source)>>,
    full: bool,
}

impl Selectors {
    /// False once full: the caller stops reading.
    fn push(&mut self, sel: GpuSelector, source: Source) -> bool {
        if self.full {
            return false;
        }
        let key = match &sel {
            GpuSelector::Uuid(u) => GpuSelector::Uuid(u.to_ascii_lowercase()),
            GpuSelector::MigUuid(u) => GpuSelector::MigUuid(u.to_ascii_lowercase()),
            GpuSelector::Invalid(_) => GpuSelector::Invalid(String::new()),
            other => other.clone(),
        };
        let seen = self.seen.get_or_insert_with(HashSet::new);
        if seen.contains(&(key.clone(), source)) {
            return true;
        }
        if self.out.len() >= MAX_SELECTORS {
            self.full = true;
            self.out.push((GpuSelector::Unread, source));
            return false;
        }
        seen.insert((key, source));
        self.out.push((sel, source));
        true
    }
}

/// The GPUs a container selects through `NVIDIA_VISIBLE_DEVICES` or CDI annotations in
/// config.json. This is the only way a container's environment reaches devgate: as a list
/// of GPUs to check, never as configuration. Each token is read by NVIDIA's rules
/// (`selector`, [`visible_devices_tokens`]), `all` ends the list, and a token NVIDIA
/// refuses is kept as `Invalid` so it is judged, not dropped.
///
/// The toolkit takes one source by precedence (CDI annotations, then the device plugin's
/// mounts, then the variable), but which it takes depends on its config and mode, and
/// containerd and CRI-O inject the annotations' devices themselves: devgate reads all
/// three, so that it checks every GPU any setup hands over.
pub fn gpu_selectors(spec: &Spec) -> Vec<(GpuSelector, Source)> {
    gpu_selectors_with(spec, ToolkitDefaults)
}

/// What the node's NVIDIA toolkit config says where it changes which GPUs a container
/// gets, each asked only when the spec makes it matter (a read of the toolkit's files).
pub trait ToolkitKeys {
    /// `gpu.env_selectors`: whether the variable selects in an unprivileged container.
    fn env_selectors(&mut self) -> bool;
    /// `accept-nvidia-visible-devices-as-volume-mounts`: whether the toolkit takes the
    /// device plugin's mounts instead of the variable.
    fn volume_mounts(&mut self) -> bool;
}

/// The toolkit's defaults, for the fast tests that run before any config is read: the
/// variable selects, the mounts are not read (so a legacy CUDA image gets every GPU).
pub struct ToolkitDefaults;

impl ToolkitKeys for ToolkitDefaults {
    fn env_selectors(&mut self) -> bool {
        true
    }
    fn volume_mounts(&mut self) -> bool {
        false
    }
}

/// A closure answers `env_selectors` alone; the mounts key keeps the toolkit's default.
impl<F: FnMut() -> bool> ToolkitKeys for F {
    fn env_selectors(&mut self) -> bool {
        self()
    }
    fn volume_mounts(&mut self) -> bool {
        false
    }
}

/// [`gpu_selectors`], with the variable itself read only when `toolkit.env_selectors()`
/// (`gpu.env_selectors`) says so. It is asked only when the spec has the variable or a
/// legacy CUDA image's `CUDA_VERSION` (it may read the NVIDIA toolkit's config, a file most
/// containers, with no GPU, have no use for); `toolkit.volume_mounts()` only for a legacy
/// image without the variable whose mounts name GPUs.
/// The device plugin's volume mounts are read either way: they are how it names GPUs in
/// the toolkit's setup that turns the variable off for unprivileged containers
/// (`accept-nvidia-visible-devices-envvar-when-unprivileged = false`, which is also
/// `gpu.env_selectors`'s default), and the toolkit reads them whatever that key says.
pub fn gpu_selectors_with(
    spec: &Spec,
    mut toolkit: impl ToolkitKeys,
) -> Vec<(GpuSelector, Source)> {
    let mut out = Selectors::default();
    for device in volume_mount_devices(spec) {
        for name in device_request_names(&device) {
            if let Some(s) = parse_selector(name) {
                if !out.push(s, Source::NvidiaVisibleDevices) {
                    return out.out;
                }
            }
        }
    }
    // Start-up trick (docs/performance.md). Plain: read the toolkit's config for every spec.
    // Without the variable or CUDA_VERSION nothing below selects a GPU, whatever `env`.
    // A container the toolkit takes for privileged gets the variable's GPUs whatever its
    // config says (`env` follows the unprivileged case's key), so they are checked too.
    let cuda = spec.env("CUDA_VERSION").is_some_and(|v| !v.is_empty());
    let swarm = spec.env_with_prefix(SWARM_RESOURCE_PREFIX);
    if (spec.env(NVIDIA_VISIBLE_DEVICES).is_none() && !cuda && swarm.is_empty())
        || !(spec.privileged_to_nvidia() || toolkit.env_selectors())
    {
        return cdi_selectors(spec, out);
    }
    // A legacy CUDA image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) without the variable gets
    // every GPU from the toolkit (`devicesFromEnvvars`), unless the toolkit reads the
    // mounts (`accept-nvidia-visible-devices-as-volume-mounts`, default false) and they
    // named some.
    let legacy_all = spec.env(NVIDIA_VISIBLE_DEVICES).is_none()
        && cuda
        && spec.env("NVIDIA_REQUIRE_CUDA").map_or(true, str::is_empty)
        && (out.out.is_empty() || !toolkit.volume_mounts());
    // The device plugin's volume-mounts strategy sets the variable to the mounts' root:
    // the list is the mounts above, not this value.
    let env = spec
        .env(NVIDIA_VISIBLE_DEVICES)
        .or(legacy_all.then_some("all"))
        .filter(|v| v.trim_end_matches('/') != VOLUME_MOUNTS_ROOT);
    // Each variable read on its own: every GPU the toolkit's one list of them names is in
    // one of their own lists.
    for v in env.into_iter().chain(swarm.into_iter().map(|(_, v)| v)) {
        for token in visible_devices_tokens(v) {
            // The runtime's CDI mode takes a qualified CDI name in the variable as it is
            // (and its `auto` mode switches to CDI for one).
            if let Some(s) = parse_selector(cdi_gpu_name(token).unwrap_or(token)) {
                let all = s == GpuSelector::All;
                if !out.push(s, Source::NvidiaVisibleDevices) {
                    return out.out;
                }
                if all {
                    break;
                }
            }
        }
    }
    cdi_selectors(spec, out)
}

/// The tokens of an `NVIDIA_VISIBLE_DEVICES` value as the toolkit hands them on since
/// v1.12.0 (`devicesFromEnvvars`): split on commas, each trimmed with Go's
/// `strings.TrimSpace`, empty ones skipped. Rust's `str::trim` removes the same set,
/// Unicode White_Space (not U+200B nor U+FEFF). v1.11 and older hand the tokens on
/// untrimmed; a token they read as a GPU reads as the same GPU trimmed (glibc skips the
/// leading ASCII white space, and trailing white space makes every form but `<gpu>:<mig>`
/// refused, which ignores it), so this one reading covers both.
///
/// `void` anywhere means no devices since v1.12.0, and the first of `all`, `none` or
/// `void` decides there; v1.11 reads `2,void` and `none,2` as GPU 2. Each token is read
/// on its own (`void` and `none` select nothing, `all` every GPU), so devgate checks the
/// GPUs of every version's reading.
pub fn visible_devices_tokens(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|t| !t.is_empty())
}

/// The CDI annotations' GPUs, after those in `out`.
fn cdi_selectors(spec: &Spec, mut out: Selectors) -> Vec<(GpuSelector, Source)> {
    for (k, v) in &spec.annotations {
        if !k.starts_with(CDI_ANNOTATION_PREFIX) {
            continue;
        }
        // Split and not trimmed, as the CDI library's `ParseAnnotations` (which refuses
        // ` nvidia.com/gpu=2`: the start fails) and the toolkit read them. The toolkit's
        // runtime since v1.18.0 takes `2` as a GPU of its default kind, and ` nvidia.com/gpu=2`
        // as a name under that kind that it refuses: an unknown.
        for name in v.split(',').flat_map(device_request_names) {
            if let Some(s) = parse_selector(name) {
                if !out.push(s, Source::CdiAnnotation) {
                    return out.out;
                }
            }
        }
    }
    out.out
}

/// The NVIDIA toolkit's `accept-nvidia-visible-devices-as-volume-mounts`: the device
/// plugin names each GPU by a mount of `/dev/null` at `<root>/<name>`; `cdi/<kind>=<name>`
/// (or `cdi/<vendor>/<class>/<name>`) names a CDI device, `imex/…` an IMEX channel (not a
/// GPU). Read as the toolkit reads them (`DevicesFromMounts`): both paths through Go's
/// `filepath.Clean`, the destination matched by a plain string prefix (no separator
/// needed after it: `<root>3` is GPU 3) and the rest trimmed of `/` at both ends; a
/// `cdi/` request made a qualified name by splitting it at its first two `/`
/// (`cdiDeviceMountRequest.qualifiedName`). What each device names: [`device_request_names`].
const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";

fn volume_mount_devices(spec: &Spec) -> impl Iterator<Item = String> + '_ {
    spec.mounts.iter().filter_map(|m| {
        if go_clean(&m.source.as_deref()?.to_string_lossy()) != "/dev/null" {
            return None;
        }
        let destination = go_clean(&m.destination.to_string_lossy());
        let name = destination
            .strip_prefix(VOLUME_MOUNTS_ROOT)?
            .trim_matches('/');
        if name.is_empty() || name.starts_with("imex/") {
            return None;
        }
        match name.strip_prefix("cdi/") {
            Some(cdi) if qualified_cdi_name(cdi).is_some() => Some(cdi.to_string()),
            // `<vendor>/<class>/<name>`
            Some(cdi) => match cdi.splitn(3, '/').collect::<Vec<_>>()[..] {
                [vendor, class, name] => Some(format!("{vendor}/{class}={name}")),
                _ => None,
            },
            None => Some(name.to_string()),
        }
    })
}

/// Go's `filepath.Clean`, lexically: repeated and trailing `/` and `.` elements go, `..`
/// takes the element before it (and above the root, nothing).
fn go_clean(p: &str) -> String {
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." if out.last().is_some_and(|l| *l != "..") => {
                out.pop();
            }
            ".." if rooted => {}
            c => out.push(c),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// A GPU a selector chose, once NVML has said which minor it has: `/dev/nvidiaN`. Its
/// `host_path`, when found, is a node of that number as stat'ed below dev_root by this call
/// (as [`crate::discover::discover`]'s are).
pub fn selected_gpu(
    minor: u32,
    source: Source,
    rules: &[ClassRule],
    dev_root: &Path,
    sysfs_root: &Path,
) -> Device {
    let num = DevNum {
        typ: DevType::Char,
        major: class::NVIDIA_MAJOR,
        minor,
    };
    let container_path = PathBuf::from(format!("/dev/nvidia{minor}"));
    let hints = vec![dev_root.join(format!("nvidia{minor}"))];
    let host_path = find_host_node(dev_root, sysfs_root, num, &hints);
    let class = {
        let paths: Vec<&Path> = [Some(container_path.as_path()), host_path.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        class::classify(rules, num.typ, num.major, num.minor, &paths)
    };
    Device {
        num,
        class,
        container_path: Some(container_path),
        host_path,
        source,
        file_mode: None,
        uid: None,
        gid: None,
    }
}

/// Minors of the `nvidiaN` char nodes directly under dev_root (not following links): the
/// GPUs `all` means when NVML cannot say.
pub fn gpu_minor_nodes(dev_root: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    walk_nodes(dev_root, 1, |path| {
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("nvidia"))
            .and_then(|n| n.parse::<u32>().ok());
        let gpu = DevNum {
            typ: DevType::Char,
            major: NVIDIA_MAJOR,
            minor: named.unwrap_or(0),
        };
        if named.is_some() && node_num(path) == Some(gpu) {
            out.push(gpu.minor);
        }
        ControlFlow::Continue(())
    });
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::may_have_devices;

    fn spec(json: &str) -> Spec {
        Spec::parse(json.as_bytes(), Path::new("/b/config.json")).unwrap()
    }

    /// The toolkit's `swarm-resource` (commented default `DOCKER_RESOURCE_GPU`) names
    /// variables it reads instead of `NVIDIA_VISIBLE_DEVICES` when a container sets one
    /// (internal/config/image: `WithPreferredVisibleDevicesEnvVars`, `visibleEnvVars`).
    #[test]
    fn docker_resource_variables_select_as_the_toolkits_swarm_resource_reads_them() {
        let idx = |v: Vec<(GpuSelector, Source)>| -> Vec<GpuSelector> {
            v.into_iter().map(|(s, _)| s).collect()
        };
        let s = spec(r#"{"process":{"env":["DOCKER_RESOURCE_GPU= 2 ,3"]}}"#);
        assert_eq!(
            idx(gpu_selectors(&s)),
            [GpuSelector::Index(2), GpuSelector::Index(3)]
        );
        // beside the variable: both are read (the toolkit takes one, devgate the union)
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","DOCKER_RESOURCE_GPUS=1",
                "DOCKER_RESOURCE_GPUS=4"]}}"#,
        );
        assert_eq!(
            idx(gpu_selectors(&s)),
            [GpuSelector::Index(0), GpuSelector::Index(4)]
        );
        // the same gate as the variable: not read when env selectors are off
        let s = spec(r#"{"process":{"env":["DOCKER_RESOURCE_GPU=2"]}}"#);
        assert!(gpu_selectors_with(&s, Keys(false, false)).is_empty());
        assert!(crate::gpu::may_name_nvidia(&s));
        // a name that only begins like one is not one
        let s = spec(r#"{"process":{"env":["DOCKER_RESOURCE=2","XDOCKER_RESOURCE_GPU=2"]}}"#);
        assert!(gpu_selectors(&s).is_empty());
    }

    /// A legacy CUDA image (`CUDA_VERSION`, no `NVIDIA_REQUIRE_CUDA`) without the variable
    /// gets every GPU from the toolkit. The device plugin's mounts change that only where
    /// `accept-nvidia-visible-devices-as-volume-mounts` is true, which is not its default:
    /// with a mount of GPU 0 and the toolkit's defaults, every GPU is checked.
    #[test]
    fn a_legacy_cuda_image_with_a_plugin_mount_gets_every_gpu_by_the_toolkits_defaults() {
        let s = spec(
            r#"{"process":{"env":["CUDA_VERSION=12.2"]},
                "mounts":[{"destination":"/var/run/nvidia-container-devices/0",
                           "source":"/dev/null","type":"bind"}]}"#,
        );
        let got = gpu_selectors(&s);
        assert!(got.iter().any(|(g, _)| *g == GpuSelector::All), "{got:?}");
        // the node's toolkit reads the mounts: GPU 0 alone, as the toolkit hands it over
        let got = gpu_selectors_with(&s, Keys(true, true));
        assert_eq!(got, [(GpuSelector::Index(0), Source::NvidiaVisibleDevices)]);
        // and with the variable off for unprivileged containers, the mounts alone
        let got = gpu_selectors_with(&s, Keys(false, false));
        assert_eq!(got, [(GpuSelector::Index(0), Source::NvidiaVisibleDevices)]);
    }

    /// Fixed toolkit keys: (env_selectors, volume_mounts).
    struct Keys(bool, bool);

    impl ToolkitKeys for Keys {
        fn env_selectors(&mut self) -> bool {
            self.0
        }
        fn volume_mounts(&mut self) -> bool {
            self.1
        }
    }

    #[test]
    fn selectors_with_multibyte_characters_do_not_panic() {
        assert!(matches!(
            parse_selector("gpu-1234"),
            Some(GpuSelector::Uuid(_))
        ));
        let s = Spec::parse(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=aé€x"]},
                "annotations":{"cdi.k8s.io/x":"nvidia.com/gpu=aé€x"}}"#
                .as_bytes(),
            Path::new("/c"),
        )
        .unwrap();
        let got = gpu_selectors(&s);
        assert_eq!(got.len(), 2);
        assert!(got
            .iter()
            .all(|(g, _)| matches!(g, GpuSelector::Invalid(r) if r.contains("aé€x"))));
    }

    /// Long because most of it is the expected list, one row per token in the order the
    /// environment and the annotation give them.
    #[test]
    fn gpu_selectors_from_env_and_cdi() {
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0,GPU-AbC-1,3:1,MIG-xyz,,junk,00002,0:3b:00.0"]},
                "annotations":{"cdi.k8s.io/devgate":"nvidia.com/gpu=2,vendor.com/x=1,nvidia.com/gpu=all",
                               "other/key":"nvidia.com/gpu=5"}}"#,
        );
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Index(0), Source::NvidiaVisibleDevices),
                (
                    GpuSelector::Uuid("GPU-AbC-1".into()),
                    Source::NvidiaVisibleDevices
                ),
                (
                    GpuSelector::Mig {
                        gpu: 3,
                        instance: 1
                    },
                    Source::NvidiaVisibleDevices
                ),
                (
                    GpuSelector::MigUuid("MIG-xyz".into()),
                    Source::NvidiaVisibleDevices
                ),
                (
                    GpuSelector::Invalid(
                        "\"junk\" is not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void".into()
                    ),
                    Source::NvidiaVisibleDevices
                ),
                (GpuSelector::Index(2), Source::NvidiaVisibleDevices),
                (
                    GpuSelector::PciBusId {
                        domain: 0,
                        bus: 0x3b,
                        device: 0,
                        or_mig: Some((0, 3)),
                    },
                    Source::NvidiaVisibleDevices
                ),
                (GpuSelector::Index(2), Source::CdiAnnotation),
                (GpuSelector::All, Source::CdiAnnotation),
            ]
        );
        assert!(may_have_devices(&s));
        for none in ["void", "none", ""] {
            let s = spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES={none}"]}}}}"#
            ));
            assert!(gpu_selectors(&s).is_empty(), "{none:?}");
            assert!(!may_have_devices(&s));
        }
        // the last assignment wins, as in execve's environment
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=all","NVIDIA_VISIBLE_DEVICES=void"]}}"#,
        );
        assert!(gpu_selectors(&s).is_empty());
        // `all` ends the list, as in libnvidia-container
        let s = spec(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=ALL,junk"]}}"#);
        assert_eq!(
            gpu_selectors(&s),
            vec![(GpuSelector::All, Source::NvidiaVisibleDevices)]
        );
        let s = spec(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0, 1"]}}"#);
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Index(0), Source::NvidiaVisibleDevices),
                (GpuSelector::Index(1), Source::NvidiaVisibleDevices)
            ]
        );
        let s = spec(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=1 "]}}"#);
        assert_eq!(
            gpu_selectors(&s),
            vec![(GpuSelector::Index(1), Source::NvidiaVisibleDevices)]
        );
    }

    fn env_spec(value: &str) -> Spec {
        let json = serde_json::json!({ "process": { "env": [format!("NVIDIA_VISIBLE_DEVICES={value}")] } });
        spec(&json.to_string())
    }

    /// Since v1.12.0 the toolkit trims each token of the variable with Go's
    /// `strings.TrimSpace` (Unicode White_Space) and skips empty ones before it hands them
    /// on, so `2 ` is GPU 2 there: devgate must check it, not call it unknown. U+200B and
    /// U+FEFF are not White_Space and stay.
    #[test]
    fn variable_tokens_are_trimmed_as_the_toolkit_trims_them() {
        let env = Source::NvidiaVisibleDevices;
        for v in [
            "2 ",
            "2\t",
            "2\u{a0}",
            "2\u{3000}",
            "\u{85}2\u{2028}",
            " 2 ,",
            "\u{a0},2",
        ] {
            assert_eq!(
                gpu_selectors(&env_spec(v)),
                vec![(GpuSelector::Index(2), env)],
                "{v:?}"
            );
        }
        assert_eq!(
            gpu_selectors(&env_spec("\u{3000}GPU-aBc ")),
            vec![(GpuSelector::Uuid("GPU-aBc".into()), env)]
        );
        assert_eq!(
            gpu_selectors(&env_spec(" all\t,junk")),
            vec![(GpuSelector::All, env)]
        );
        assert_eq!(
            gpu_selectors(&env_spec(" nvidia.com/gpu=3 ")),
            vec![(GpuSelector::Index(3), env)]
        );
        // a trimmed `void` or `none` selects nothing, like the bare word
        for v in [" void", "none\u{a0}", " , "] {
            assert!(gpu_selectors(&env_spec(v)).is_empty(), "{v:?}");
        }
        for v in ["2\u{200b}", "\u{feff}2"] {
            assert!(
                matches!(
                    gpu_selectors(&env_spec(v))[..],
                    [(GpuSelector::Invalid(_), _)]
                ),
                "{v:?}"
            );
        }
    }

    /// The CDI annotations are split on commas and not trimmed (the CDI library's
    /// `ParseAnnotations`, and the toolkit's own reading): ` nvidia.com/gpu=2` is no
    /// qualified name, which the toolkit's runtime since v1.18.0 takes as a name of its
    /// default kind and refuses (the start fails): an unknown, as is `3\t`, never GPU 2 or 3.
    /// A name that is not qualified and that NVIDIA reads, `5`, is that GPU of the default
    /// kind, and `runtime.nvidia.com/gpu` is NVIDIA's kind too.
    #[test]
    fn cdi_annotation_values_are_not_trimmed() {
        let s = spec(
            r#"{"annotations":{"cdi.k8s.io/a":" nvidia.com/gpu=2,nvidia.com/gpu=3\t,nvidia.com/gpu=4,5,runtime.nvidia.com/gpu=6"}}"#,
        );
        let cdi = Source::CdiAnnotation;
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Invalid(
                    "\" nvidia.com/gpu=2\" is not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void".into()
                ), cdi),
                (GpuSelector::Index(4), cdi),
                (GpuSelector::Index(5), cdi),
                (GpuSelector::Index(6), cdi),
            ]
        );
        let s = spec(r#"{"annotations":{"cdi.k8s.io/a":"nvidia.com/gpu=3\t"}}"#);
        assert!(
            matches!(&gpu_selectors(&s)[..], [(GpuSelector::Invalid(r), _)] if r.contains("3\\t"))
        );
    }

    /// The toolkit reads the volume mounts through Go's `filepath.Clean`, with a plain
    /// string prefix (`strings.HasPrefix(destination, root)`, no separator after it) and
    /// `strings.Trim(…, "/")`, and takes `cdi/<vendor>/<class>/<name>` too; and a legacy
    /// CUDA image (`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` not, no
    /// `NVIDIA_VISIBLE_DEVICES`) gets every GPU. Each is a GPU the container gets.
    #[test]
    fn spellings_the_toolkit_reads_name_gpus() {
        let s = spec(
            r#"{"mounts":[
                  {"destination":"/var/run/nvidia-container-devices3","source":"/dev/null"},
                  {"destination":"/var/run/./nvidia-container-devices//GPU-aBc/","source":"/dev//null"},
                  {"destination":"/var/run/nvidia-container-devices/x/../5","source":"/dev/x/../null"},
                  {"destination":"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/6","source":"/dev/null"}]}"#,
        );
        let env = Source::NvidiaVisibleDevices;
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Index(3), env),
                (GpuSelector::Uuid("GPU-aBc".into()), env),
                (GpuSelector::Index(5), env),
                (GpuSelector::Index(6), env),
            ]
        );
        let legacy = spec(r#"{"process":{"env":["CUDA_VERSION=9.0.176"]}}"#);
        assert_eq!(gpu_selectors(&legacy), vec![(GpuSelector::All, env)]);
        assert!(may_have_devices(&legacy));
        for not_all in [
            r#"{"process":{"env":["CUDA_VERSION=9.0.176","NVIDIA_REQUIRE_CUDA=cuda>=9.0"]}}"#,
            r#"{"process":{"env":["CUDA_VERSION=9.0.176","NVIDIA_VISIBLE_DEVICES=void"]}}"#,
            r#"{"process":{"env":["CUDA_VERSION="]}}"#,
        ] {
            assert!(gpu_selectors(&spec(not_all)).is_empty(), "{not_all}");
        }
    }

    /// The CDI kinds NVIDIA's own specs name GPUs by: nvidia-ctk's `nvidia.com/gpu`, the
    /// device plugin's `k8s.device-plugin.nvidia.com/gpu` and the management spec's
    /// `management.nvidia.com/gpu`; and a qualified CDI name in the variable, which the
    /// runtime's CDI mode takes as it is (and its `auto` mode switches to CDI for).
    #[test]
    fn every_nvidia_cdi_gpu_kind_selects_in_annotations_mounts_and_the_variable() {
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1,k8s.device-plugin.nvidia.com/gpu=GPU-aBc"]},
                "annotations":{"cdi.k8s.io/a":"k8s.device-plugin.nvidia.com/gpu=2",
                               "cdi.k8s.io/b":"management.nvidia.com/gpu=all,vendor.com/nic=1"},
                "mounts":[{"destination":"/var/run/nvidia-container-devices/cdi/k8s.device-plugin.nvidia.com/gpu=3","source":"/dev/null"}]}"#,
        );
        let (env, cdi) = (Source::NvidiaVisibleDevices, Source::CdiAnnotation);
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Index(3), env),
                (GpuSelector::Index(1), env),
                (GpuSelector::Uuid("GPU-aBc".into()), env),
                (GpuSelector::Index(2), cdi),
                (GpuSelector::All, cdi),
            ]
        );
    }

    /// `gpu.env_selectors: false` drops the variable (and a legacy image's `all`), never
    /// the device plugin's volume mounts nor CDI annotations.
    #[test]
    fn without_env_selectors_mounts_and_cdi_still_select() {
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=1","CUDA_VERSION=9.0"]},
                "annotations":{"cdi.k8s.io/x":"nvidia.com/gpu=2"},
                "mounts":[{"destination":"/var/run/nvidia-container-devices/3","source":"/dev/null"}]}"#,
        );
        assert_eq!(
            gpu_selectors_with(&s, || false),
            vec![
                (GpuSelector::Index(3), Source::NvidiaVisibleDevices),
                (GpuSelector::Index(2), Source::CdiAnnotation),
            ]
        );
        assert_eq!(gpu_selectors_with(&s, || true).len(), 3);
    }

    /// The toolkit honours the variable in a container whose bounding set holds
    /// CAP_SYS_ADMIN (its `IsPrivileged`) whatever
    /// `accept-nvidia-visible-devices-envvar-when-unprivileged` says: a pod that adds
    /// SYS_ADMIN (not `privileged: true`, so no host device is listed) and names a GPU, a
    /// quarantined one say, in the variable gets it from the toolkit, and devgate must check
    /// it. Pre-1.0 specs give the capabilities as one list; the toolkit reads both.
    #[test]
    fn a_container_with_cap_sys_admin_selects_by_the_variable_whatever_env_selectors() {
        for caps in [
            r#"{"bounding":["CAP_CHOWN","CAP_SYS_ADMIN"],"effective":[]}"#,
            r#"["CAP_SYS_ADMIN"]"#,
        ] {
            let s = spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES=1"],"capabilities":{caps}}}}}"#
            ));
            assert_eq!(
                gpu_selectors_with(&s, || false),
                vec![(GpuSelector::Index(1), Source::NvidiaVisibleDevices)],
                "{caps}"
            );
        }
        // CAP_SYS_ADMIN elsewhere than the bounding set, or none, or a shape no runtime
        // takes (which still parses): unprivileged to the toolkit
        for caps in [
            r#"{"bounding":["CAP_CHOWN"],"effective":["CAP_SYS_ADMIN"]}"#,
            r#"{"bounding":["cap_sys_admin"]}"#,
            r#"[]"#,
            r#"{}"#,
            r#"null"#,
            r#"5"#,
            r#"{"bounding":["CAP_SYS_ADMIN",1]}"#,
        ] {
            let s = spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES=1"],"capabilities":{caps}}}}}"#
            ));
            assert_eq!(gpu_selectors_with(&s, || false), vec![], "{caps}");
        }
    }

    /// Whether the variable counts (which may take a read of the NVIDIA toolkit's config)
    /// is asked only of a spec that has the variable or `CUDA_VERSION`: without either it
    /// could select nothing.
    #[test]
    fn env_selectors_is_asked_only_when_the_spec_could_use_it() {
        let s = spec(
            r#"{"process":{"env":["PATH=/bin","CUDA_VERSION="]},
                "annotations":{"cdi.k8s.io/x":"nvidia.com/gpu=2"}}"#,
        );
        let got = gpu_selectors_with(&s, || panic!("asked without the variable"));
        assert_eq!(got, vec![(GpuSelector::Index(2), Source::CdiAnnotation)]);
        for env in ["NVIDIA_VISIBLE_DEVICES=void", "CUDA_VERSION=12.2"] {
            let s = spec(&format!(r#"{{"process":{{"env":["{env}"]}}}}"#));
            let mut asked = false;
            gpu_selectors_with(&s, || {
                asked = true;
                false
            });
            assert!(asked, "{env}");
        }
    }

    /// NVIDIA's tooling reads every token; so must devgate, however many come before the
    /// GPU that matters: repeats of one GPU, or tokens NVIDIA refuses, cannot push a GPU
    /// out of the list, and past the bound on distinct selectors the rest is any GPU.
    #[test]
    fn no_count_of_tokens_hides_the_last_gpu() {
        let env = |v: String| Spec {
            process: serde_json::from_value(serde_json::json!({
                "env": [format!("NVIDIA_VISIBLE_DEVICES={v}")]
            }))
            .unwrap(),
            ..Spec::default()
        };
        let repeats = format!("{}3", "0,00,+0,".repeat(300));
        let got = gpu_selectors(&env(repeats));
        assert!(
            got.contains(&(GpuSelector::Index(3), Source::NvidiaVisibleDevices)),
            "{:?}",
            &got[got.len().saturating_sub(3)..]
        );
        assert_eq!(got.len(), 2, "spellings of GPU 0 are one selector");
        // 100 000 distinct refused tokens: one unknown is kept, and GPU 3 is still read
        let refused: String = (0..100_000).map(|i| format!("x{i},")).collect();
        let got = gpu_selectors(&env(format!("{refused}3")));
        assert_eq!(got.len(), 2, "{:?}", &got[..2.min(got.len())]);
        assert!(matches!(&got[0].0, GpuSelector::Invalid(r) if r.contains("\"x0\"")));
        assert_eq!(got[1].0, GpuSelector::Index(3));
        // more distinct selectors than the bound: the rest is read as any GPU, named
        let many: String = (0..MAX_SELECTORS + 10)
            .map(|i| format!("GPU-{i:x},"))
            .collect();
        let got = gpu_selectors(&env(format!("{many}3")));
        assert_eq!(got.len(), MAX_SELECTORS + 1);
        assert_eq!(
            got[MAX_SELECTORS],
            (GpuSelector::Unread, Source::NvidiaVisibleDevices)
        );
    }

    #[test]
    fn the_device_plugins_volume_mounts_name_gpus() {
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]},
                "mounts":[
                  {"destination":"/var/run/nvidia-container-devices/GPU-aBc","source":"/dev/null"},
                  {"destination":"/var/run/nvidia-container-devices/3","source":"/dev/null"},
                  {"destination":"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=1","source":"/dev/null"},
                  {"destination":"/var/run/nvidia-container-devices/imex/channel0","source":"/dev/null"},
                  {"destination":"/var/run/nvidia-container-devices/5","source":"/tmp/x"},
                  {"destination":"/elsewhere/6","source":"/dev/null"}]}"#,
        );
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (
                    GpuSelector::Uuid("GPU-aBc".into()),
                    Source::NvidiaVisibleDevices
                ),
                (GpuSelector::Index(3), Source::NvidiaVisibleDevices),
                (GpuSelector::Index(1), Source::NvidiaVisibleDevices),
            ]
        );
    }

    #[test]
    fn selected_gpu_is_an_nvidia_gpu_device() {
        let d = selected_gpu(
            3,
            Source::CdiAnnotation,
            &class::builtin(),
            Path::new("/nonexistent-dev"),
            Path::new("/nonexistent-sys"),
        );
        assert_eq!(d.class, "nvidia-gpu");
        assert_eq!(d.describe(), "/dev/nvidia3 (195:3)");
        assert_eq!(d.host_path, None);
        assert_eq!(
            serde_json::to_value(d.source).unwrap(),
            serde_json::json!("cdi-annotation")
        );
    }

    #[test]
    fn minor_nodes_are_char_195_nodes_only() {
        let dir = crate::fsutil::tests::tempdir("nvnodes");
        std::fs::write(dir.join("nvidia3"), "not a node").unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.join("nvidia4")).unwrap();
        let mk = |name: &str, minor: u32| {
            let p = std::ffi::CString::new(dir.join(name).into_os_string().into_encoded_bytes())
                .unwrap();
            // SAFETY: a valid C string; mknod only creates a file.
            unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(195, minor)) }
        };
        if mk("nvidia1", 1) == 0 {
            mk("nvidia2", 7); // a name that lies about its minor
            mk("nvidiactl", 255);
            assert_eq!(gpu_minor_nodes(&dir), vec![1]);
        } else {
            assert_eq!(
                gpu_minor_nodes(&dir),
                Vec::<u32>::new(),
                "not root: no nodes"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
