//! A reference model of how the NVIDIA container toolkit reads `NVIDIA_VISIBLE_DEVICES`,
//! written apart from `gpu::request` from the toolkit's source: `devicesFromEnvvars` in
//! `internal/config/image/cuda_image.go` and `NewVisibleDevices` in `devices.go` (v1.12.0
//! to v1.20), `DevicesFromEnvvars` at v1.11.0. The differential fuzz target
//! `toolkit_selectors` and the fixed corpus below hold devgate's reading equal to it.
//! Below the toolkit, nvidia-container-cli reads each device it is handed by glibc's rules:
//! that grammar is `selector::parse`, checked against glibc itself (`fuzzing::glibc`).
//!
//! The other two sources, from the same file (`cdiDeviceRequestsFromAnnotations`,
//! `requestsFromMounts`, `visibleDevicesFromMounts`, `VisibleDevices`) and from
//! `internal/modifier/cdi.go` (`DeviceRequests`, v1.18.0 on; `getAnnotationDevices` before):
//! CDI annotations ([`annotations_model`]) and the device plugin's volume mounts
//! ([`mounts_model`]), and the precedence the toolkit takes them in (`toolkit_sources::chosen`,
//! with the node's `accept-nvidia-visible-devices-as-volume-mounts`). The fuzz
//! target `toolkit_sources` builds specs of all three (`toolkit_sources::check_sources`).

use crate::gpu::request::{gpu_selectors_with, ToolkitDefaults, ToolkitKeys, MAX_SELECTORS};
use crate::gpu::selector::{parse, GpuSelector};
use crate::oci::spec::Spec;
use std::collections::{BTreeMap, BTreeSet};

/// What a container's value makes some toolkit version hand over: every GPU (`all`), the
/// GPUs named, and whether a token no version reads as a GPU was there (an unknown).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    pub all: bool,
    pub gpus: BTreeSet<String>,
    pub unknown: bool,
}

impl Resolution {
    /// Equal as GPUs checked: once either is `all`, the rest names nothing more.
    pub fn agrees(&self, other: &Resolution) -> bool {
        if self.all || other.all {
            return self.all == other.all;
        }
        self == other
    }

    /// Every GPU `self` names, `other` names too (and an unknown of `self` is one there).
    pub fn within(&self, other: &Resolution) -> bool {
        other.all
            || (!self.all && self.gpus.is_subset(&other.gpus) && (!self.unknown || other.unknown))
    }

    pub(super) fn add(&mut self, sel: GpuSelector) {
        match sel {
            GpuSelector::All => self.all = true,
            GpuSelector::Invalid(_) => self.unknown = true,
            // devgate's selectors past its bound: every GPU, and an unknown
            GpuSelector::Unread => {
                self.all = true;
                self.unknown = true;
            }
            // the cli compares UUIDs in any case
            GpuSelector::Uuid(u) => drop(self.gpus.insert(format!("GPU {}", u.to_lowercase()))),
            GpuSelector::MigUuid(u) => drop(self.gpus.insert(format!("MIG {}", u.to_lowercase()))),
            other => drop(self.gpus.insert(format!("{other:?}"))),
        }
    }
}

/// Go's `unicode.IsSpace`, which `strings.TrimSpace` trims: the ASCII six, U+0085, U+00A0
/// and the rest of Unicode's White_Space. Not U+200B nor U+FEFF.
fn go_is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

fn go_trim_space(s: &str) -> &str {
    s.trim_matches(go_is_space)
}

/// v1.11.0: the value whole; empty or `void` is nothing, `none` is the one device `""`;
/// anything else split on commas, untrimmed.
pub fn v1_11(value: &str) -> Vec<&str> {
    match value {
        "" | "void" => vec![],
        "none" => vec![""],
        v => v.split(',').collect(),
    }
}

/// v1.12.0 on: split, each trimmed, empty ones skipped; none left or `void` among them is
/// nothing; else the first `all` or `none` decides, and without one the list is handed on.
pub fn v1_12(value: &str) -> Vec<&str> {
    let devices: Vec<&str> = value
        .split(',')
        .map(go_trim_space)
        .filter(|d| !d.is_empty())
        .collect();
    if devices.is_empty() || devices.contains(&"void") {
        return vec![];
    }
    match devices.iter().find(|d| **d == "all" || **d == "none") {
        Some(&"all") => vec!["all"],
        Some(_) => vec![""],
        None => devices,
    }
}

/// NVIDIA's CDI kinds of GPUs: nvidia-ctk's, the device plugin's, the management spec's,
/// and `runtime.nvidia.com/gpu`, the runtime's own, whose devices it makes from the name
/// (`filterAutomaticDevices`; the default kind of its `jit-cdi` mode).
const KINDS: [&str; 4] = [
    "nvidia.com/gpu",
    "k8s.device-plugin.nvidia.com/gpu",
    "management.nvidia.com/gpu",
    "runtime.nvidia.com/gpu",
];

/// What one handed-on device names: the runtime's CDI mode takes a qualified name of one
/// of NVIDIA's GPU kinds as that CDI device; anything else goes to the cli.
fn names(device: &str) -> Option<GpuSelector> {
    let name = KINDS.iter().find_map(|k| {
        device
            .strip_prefix(k)
            .and_then(|rest| rest.strip_prefix('='))
    });
    parse(name.unwrap_or(device)).map(as_named)
}

/// One of the CDI library's `validateVendorOrClassName` (`vendor`) and `ValidateDeviceName`
/// rules, byte by byte as Go indexes a string: a first byte of `first`, a last one
/// alphanumeric, alphanumerics and `inner` between. Go slices `name[1:len(name)-1]`
/// for a vendor or class of one letter too, and panics: the runtime fails and hands over
/// nothing, read here as a qualified name of another kind, which names nothing either.
fn cdi_part(s: &str, vendor: bool) -> bool {
    let b = s.as_bytes();
    let Some((&first, rest)) = b.split_first() else {
        return false;
    };
    let first_ok = if vendor {
        first.is_ascii_alphabetic()
    } else {
        first.is_ascii_alphanumeric()
    };
    let inner: &[u8] = if vendor { b"_-." } else { b"_-.:" };
    match rest.split_last() {
        None => first_ok,
        Some((&last, mid)) => {
            first_ok
                && last.is_ascii_alphanumeric()
                && mid
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || inner.contains(c))
        }
    }
}

/// The CDI library's `ParseQualifiedName` (`pkg/parser`): `vendor/class=name` split at
/// the first `=` and then the first `/`, each part checked; the kind and name, or `None`
/// for a device that is not a qualified name.
fn qualified(device: &str) -> Option<(&str, &str)> {
    let (kind, name) = device.split_once('=')?;
    let (vendor, class) = kind.split_once('/')?;
    (cdi_part(vendor, true) && cdi_part(class, true) && cdi_part(name, false))
        .then_some((kind, name))
}

/// What the runtime's CDI modes make of one device request (`DeviceRequests`): a
/// qualified name of an NVIDIA GPU kind is that GPU, of another kind no GPU; since v1.18.0
/// anything else is a name of the default kind (`nvidia.com/gpu`, or in `jit-cdi` mode
/// `runtime.nvidia.com/gpu`; `""` becomes `none`), read here by the cli's grammar like
/// every CDI name, a superset of the names NVIDIA's specs hold. No CDI name holds a
/// comma (`ValidateDeviceName`): such a request is refused. v1.17 refuses an annotation
/// that is not a qualified name (the start fails), so its reading is within this one.
fn cdi_mode(device: &str) -> Option<GpuSelector> {
    match qualified(device) {
        Some((kind, name)) if KINDS.contains(&kind) => parse(name).map(as_named),
        Some(_) => None,
        None if device.contains(',') => Some(GpuSelector::Invalid(device.to_string())),
        None => parse(device).map(as_named),
    }
}

/// A UUID token holding white space begins no GPU's UUID (NVML's are hex and dashes), so
/// the cli refuses it as an unknown device; devgate keeps it as a UUID that NVML then
/// matches to none, an unknown too. Both sides of the check are read through this.
pub(super) fn as_named(sel: GpuSelector) -> GpuSelector {
    match &sel {
        GpuSelector::Uuid(u) | GpuSelector::MigUuid(u) if u.contains(go_is_space) => {
            GpuSelector::Invalid(u.clone())
        }
        _ => sel,
    }
}

/// The union of both versions' readings, and of their crossings: the token rule (untrimmed
/// before v1.12.0, trimmed since) and the list rule (`void` or `none` only as the whole
/// value before, `void` anywhere and the first `all`/`none` deciding since) changed
/// together, but devgate does not rely on that, so `none,2 ` is GPU 2 here (v1.11's list
/// rule over trimmed tokens). A device the cli refuses counts as an unknown only when its
/// trimmed form is refused too: v1.11's `2 ` is v1.12's GPU 2, a GPU named. The device
/// plugin's marker value (the volume mounts' root) names nothing: the toolkit reads the
/// mounts instead, or refuses the path and the start fails.
pub fn model(value: &str) -> Resolution {
    let mut r = Resolution::default();
    if value.trim_end_matches('/') == "/var/run/nvidia-container-devices" {
        return r;
    }
    let crossed = v1_11(value).into_iter().map(go_trim_space);
    let devices = v1_11(value).into_iter().chain(crossed).chain(v1_12(value));
    for device in devices {
        match names(device) {
            Some(GpuSelector::Invalid(_)) => {
                if let Some(GpuSelector::Invalid(why)) = names(go_trim_space(device)) {
                    r.add(GpuSelector::Invalid(why));
                }
            }
            Some(sel) => r.add(sel),
            None => {}
        }
    }
    r
}

/// devgate's reading of the same value, as the only thing in a spec; `None` past
/// [`MAX_SELECTORS`], where devgate adds an unknown of its own by design.
pub fn devgate(value: &str) -> Option<Resolution> {
    let json =
        serde_json::json!({ "process": { "env": [format!("NVIDIA_VISIBLE_DEVICES={value}")] } });
    let spec = Spec::parse(
        json.to_string().as_bytes(),
        std::path::Path::new("config.json"),
    )
    .ok()?;
    devgate_spec(&spec)
}

/// devgate's reading of a whole spec; `None` past [`MAX_SELECTORS`].
pub fn devgate_spec(spec: &Spec) -> Option<Resolution> {
    devgate_spec_with(spec, ToolkitDefaults)
}

/// [`devgate_spec`] on a node whose toolkit config says what `toolkit` does.
pub fn devgate_spec_with(spec: &Spec, toolkit: impl ToolkitKeys) -> Option<Resolution> {
    let selectors = gpu_selectors_with(spec, toolkit);
    if selectors.len() > MAX_SELECTORS {
        return None;
    }
    let mut r = Resolution::default();
    for (s, _) in selectors {
        r.add(as_named(s));
    }
    Some(r)
}

/// `cdiDeviceRequestsFromAnnotations`: the values of the keys with the runtime's prefix
/// (`annotation-prefixes`, default `cdi.k8s.io/`), in key order, each split on commas and
/// not trimmed, nothing checked or dropped.
pub fn annotation_devices(annotations: &BTreeMap<String, String>) -> Vec<&str> {
    annotations
        .iter()
        .filter(|(k, _)| k.starts_with("cdi.k8s.io/"))
        .flat_map(|(_, v)| v.split(','))
        .collect()
}

/// The GPUs the annotations name: every device by the CDI modes' rule. The toolkit's hook
/// (legacy mode) reads no annotations.
pub fn annotations_model(annotations: &BTreeMap<String, String>) -> Resolution {
    let mut r = Resolution::default();
    for d in annotation_devices(annotations) {
        if let Some(sel) = cdi_mode(d) {
            r.add(sel);
        }
    }
    r
}

/// Go's `filepath.Clean` on a Unix path.
fn clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for e in p.split('/') {
        match e {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !p.starts_with('/') {
                    parts.push("..");
                }
            }
            e => parts.push(e),
        }
    }
    let body = parts.join("/");
    if p.starts_with('/') {
        format!("/{body}")
    } else if body.is_empty() {
        ".".into()
    } else {
        body
    }
}

/// `requestsFromMounts` then `visibleDevicesFromMounts`, with the mounts as
/// (source, destination): a source that cleans to `/dev/null`, a cleaned destination that
/// begins with the root as a string (no `/` needed after it), the rest trimmed of `/`;
/// `imex/…` skipped; `cdi/…` a qualified name as it is, else `a/b/c` (split at the first
/// two `/`) as `a/b=c`, else skipped (`cdiDeviceMountRequest.qualifiedName`).
pub fn mount_devices(mounts: &[(String, String)]) -> Vec<String> {
    const ROOT: &str = "/var/run/nvidia-container-devices";
    let mut out = Vec::new();
    for (source, destination) in mounts {
        if clean(source) != "/dev/null" {
            continue;
        }
        let destination = clean(destination);
        let Some(rest) = destination.strip_prefix(ROOT) else {
            continue;
        };
        let device = rest.trim_matches('/');
        if device.is_empty() || device.starts_with("imex/") {
            continue;
        }
        let Some(cdi) = device.strip_prefix("cdi/") else {
            out.push(device.to_string());
            continue;
        };
        if qualified(cdi).is_some() {
            out.push(cdi.to_string());
        } else if let [a, b, c] = cdi.splitn(3, '/').collect::<Vec<_>>()[..] {
            out.push(format!("{a}/{b}={c}"));
        }
    }
    out
}

/// The GPUs the mounts name: each device as the CDI modes read it, and as the hook hands
/// the devices to nvidia-container-cli (`--devices=` the list joined with commas, which the
/// cli splits again, untrimmed: a device `1,2` is GPUs 1 and 2 there), up to `all`, which
/// ends the cli's list. A device is an unknown only when both refuse it.
pub fn mounts_model(mounts: &[(String, String)]) -> Resolution {
    let mut r = Resolution::default();
    for d in mount_devices(mounts) {
        // A qualified name holds `=`, which no GPU's index, bus id or UUID does: the cli
        // refuses it (a UUID prefix that matches no GPU).
        let qualified = qualified(&d).is_some();
        let mut cli_refuses = qualified;
        for token in d.split(',').filter(|_| !qualified) {
            match parse(token).map(as_named) {
                Some(GpuSelector::Invalid(_)) => cli_refuses = true,
                Some(GpuSelector::All) => {
                    r.add(GpuSelector::All);
                    break;
                }
                Some(sel) => r.add(sel),
                None => {}
            }
        }
        match cdi_mode(&d) {
            Some(GpuSelector::Invalid(why)) if cli_refuses => r.add(GpuSelector::Invalid(why)),
            Some(GpuSelector::Invalid(_)) | None => {}
            Some(sel) => r.add(sel),
        }
    }
    r
}

/// The differential check itself: devgate names exactly the GPUs the model does.
pub fn check(value: &str) {
    if let Some(d) = devgate(value) {
        let m = model(value);
        assert!(
            m.agrees(&d),
            "{value:?}: toolkit model {m:?}, devgate {d:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::toolkit_sources::*;
    use super::*;

    /// Spellings each rule of the toolkit's reading turns on, and their neighbours.
    const CORPUS: &[&str] = &[
        "",
        ",",
        " , ",
        "2",
        "2 ",
        " 2",
        "2\t",
        "2\u{a0}",
        "2\u{3000}",
        "\u{85}2\u{2028}",
        "2\u{200b}",
        "\u{feff}2",
        "2\u{180e}",
        "1,2",
        "1, 2 ,3",
        "2,void",
        "void,2",
        " void",
        "2, void",
        "none",
        "none,2",
        "2,none",
        " none ",
        "all",
        "ALL",
        " all",
        "all ,junk",
        "none,all",
        "all,none",
        "void,all",
        "2,all",
        "junk",
        "junk ",
        "1 ,junk",
        "GPU-aBc ",
        "\u{3000}GPU-aBc",
        " GPU-1",
        "MIG-x\t",
        "0:3b:00.0 ",
        " 0:3b:00.0",
        "1:2 ",
        "\u{a0}1:2",
        "0:3b: ",
        "nvidia.com/gpu=2 ",
        " nvidia.com/gpu=all",
        "k8s.device-plugin.nvidia.com/gpu= 3",
        "\u{b}1",
        "1\u{c}",
        "+1 ",
        "-0\r",
        "/var/run/nvidia-container-devices",
        "/var/run/nvidia-container-devices/",
        " /var/run/nvidia-container-devices",
        "00001\n",
        "1\u{2029}",
        "1\u{205f},\u{1680}2",
        // the fuzzer's find: v1.11 refuses ` 2 `, v1.12 stops at `none`; devgate checks 2
        "none,BBBBBBB , 2 ",
    ];

    #[test]
    fn devgate_reads_every_corpus_value_as_the_toolkit_model() {
        for v in CORPUS {
            check(v);
        }
    }

    #[test]
    fn the_model_follows_the_toolkits_versions() {
        assert_eq!(v1_11("2,void"), ["2", "void"]);
        assert!(v1_12("2,void").is_empty());
        assert_eq!(v1_11("none,2"), ["none", "2"]);
        assert_eq!(v1_12("none,2"), [""]);
        assert_eq!(v1_12("2 ,\u{a0},all"), ["all"]);
        assert_eq!(v1_12(" 1 ,\u{200b}2"), ["1", "\u{200b}2"]);
        assert_eq!(v1_11("none"), [""]);
        assert_eq!(v1_11(" 1 "), [" 1 "]);
        // both readings count: v1.11 hands GPU 2 over for `2,void`
        let m = model("2,void");
        assert!(!m.all && !m.unknown && m.gpus.len() == 1, "{m:?}");
        assert!(model("2 ").gpus.contains("Index(2)"));
        assert!(!model("2 ").unknown);
        assert!(model("2\u{200b}").unknown && model("2\u{200b}").gpus.is_empty());
        assert!(model("none,all").all);
        assert!(model("none, 2 ").gpus.contains("Index(2)"));
    }

    fn sources(annotations: &[&str], mounts: &[&str], variable: Option<&str>) -> Sources {
        Sources {
            annotations: annotations
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("cdi.k8s.io/{i}"), v.to_string()))
                .collect(),
            mounts: mounts
                .iter()
                .map(|d| ("/dev/null".to_string(), d.to_string()))
                .collect(),
            variable: variable.map(str::to_string),
            ..Sources::default()
        }
    }

    /// CDI annotation values each rule turns on: split on commas and not trimmed, other
    /// vendors' kinds, names not qualified (v1.18's default kind).
    const ANNOTATIONS: &[&str] = &[
        "nvidia.com/gpu=2",
        "nvidia.com/gpu= 2",
        "nvidia.com/gpu=2 ",
        " nvidia.com/gpu=2",
        "nvidia.com/gpu=2	,nvidia.com/gpu=3",
        "nvidia.com/gpu=1,,nvidia.com/gpu=2",
        "nvidia.com/gpu=1, nvidia.com/gpu=2",
        "nvidia.com/gpu=all",
        "nvidia.com/gpu=+1",
        "nvidia.com/gpu=GPU-aBc",
        "nvidia.com/gpu=0:3b:00.0",
        "nvidia.com/gpu=junk",
        "nvidia.com/gpu=",
        "nvidia.com/gpu",
        "k8s.device-plugin.nvidia.com/gpu=3",
        "management.nvidia.com/gpu=all",
        "runtime.nvidia.com/gpu=4",
        "vendor.com/nic=1",
        "vendor.com/gpu=1,nvidia.com/gpu=5",
        "amd.com/gpu=0",
        "nvidia.com/GPU=1",
        "NVIDIA.com/gpu=1",
        "a/gpu=1",
        "nvidia.com/g=1",
        "2",
        "2 ",
        "all",
        "none",
        "void",
        "",
        ",",
        "GPU-aBc",
        "GPU-x/y=1",
        "junk",
    ];

    /// Mount destinations each rule turns on.
    const MOUNTS: &[&str] = &[
        "/var/run/nvidia-container-devices/3",
        "/var/run/nvidia-container-devices3",
        "/var/run/nvidia-container-devices/",
        "/var/run/./nvidia-container-devices//GPU-aBc/",
        "/var/run/nvidia-container-devices/x/../5",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=1",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/6",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/6/7",
        "/var/run/nvidia-container-devices/cdi/vendor.com/nic/1",
        "/var/run/nvidia-container-devices/cdi/gpu=1",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu= 2",
        "/var/run/nvidia-container-devices/nvidia.com/gpu=2",
        "/var/run/nvidia-container-devices/vendor.com/nic=1",
        "/var/run/nvidia-container-devices/imex/channel0",
        "/var/run/nvidia-container-devices/1,2",
        "/var/run/nvidia-container-devices/1, 2",
        "/var/run/nvidia-container-devices/1 ,2",
        "/var/run/nvidia-container-devices/0:1,junk",
        "/var/run/nvidia-container-devices/all,junk",
        "/var/run/nvidia-container-devices/junk,all",
        "/var/run/nvidia-container-devices/2 ",
        "/var/run/nvidia-container-devices/none",
        "/elsewhere/6",
    ];

    /// Each annotation value, each mount and a few of them together, alone and beside
    /// the variable: each source alone reads as the model does, together they hold
    /// every GPU the toolkit's precedence takes.
    #[test]
    fn devgate_reads_every_source_as_the_toolkit_model() {
        for a in ANNOTATIONS {
            check_sources(&sources(&[a], &[], None));
            check_sources(&sources(&[a], &[], Some("7")));
        }
        for m in MOUNTS {
            check_sources(&sources(&[], &[m], None));
            check_sources(&sources(
                &[],
                &[m],
                Some("/var/run/nvidia-container-devices"),
            ));
            check_sources(&sources(&["nvidia.com/gpu=1"], &[m], Some("all")));
        }
        check_sources(&sources(ANNOTATIONS, MOUNTS, Some("none,2 ")));
        let other = Sources {
            annotations: BTreeMap::from([("other.io/x".into(), "nvidia.com/gpu=5".into())]),
            mounts: vec![(
                "/tmp/x".into(),
                "/var/run/nvidia-container-devices/6".into(),
            )],
            variable: None,
            ..Sources::default()
        };
        check_sources(&other);
        assert_eq!(
            devgate_spec(&other.spec().unwrap()),
            Some(Resolution::default())
        );
    }

    /// What the model makes of the rules the issue names: annotation values untrimmed,
    /// other vendors' kinds naming nothing, a mount's commas, and the precedence.
    /// Long because it is a table of cases, one rule after another.
    #[test]
    fn the_model_reads_annotations_and_mounts_as_the_toolkit() {
        let ann = |v: &str| annotations_model(&BTreeMap::from([("cdi.k8s.io/x".into(), v.into())]));
        let gpus = |r: Resolution| r.gpus.into_iter().collect::<Vec<_>>();
        // untrimmed: neither is a qualified name, and the default kind's name is refused
        for v in [
            "nvidia.com/gpu= 2",
            "nvidia.com/gpu=2 ",
            " nvidia.com/gpu=2",
        ] {
            let r = ann(v);
            assert!(r.unknown && r.gpus.is_empty() && !r.all, "{v:?}: {r:?}");
        }
        assert_eq!(gpus(ann("nvidia.com/gpu=2")), ["Index(2)"]);
        assert_eq!(ann("vendor.com/nic=1,amd.com/gpu=0"), Resolution::default());
        assert_eq!(gpus(ann("2")), ["Index(2)"], "v1.18: the default kind");
        assert_eq!(gpus(ann("runtime.nvidia.com/gpu=4")), ["Index(4)"]);
        // a one-letter vendor panics the CDI library: nothing handed over
        assert_eq!(ann("a/gpu=1"), Resolution::default());
        let mounts = |d: &[&str]| {
            let m: Vec<_> = d
                .iter()
                .map(|d| {
                    (
                        "/dev/null".to_string(),
                        format!("/var/run/nvidia-container-devices/{d}"),
                    )
                })
                .collect();
            mounts_model(&m)
        };
        assert_eq!(gpus(mounts(&["1,2"])), ["Index(1)", "Index(2)"]);
        assert!(!mounts(&["1,2"]).unknown);
        assert_eq!(gpus(mounts(&["cdi/nvidia.com/gpu/6"])), ["Index(6)"]);
        assert_eq!(
            mounts(&["cdi/vendor.com/nic/1", "imex/channel0"]),
            Resolution::default()
        );
        assert_eq!(
            mount_devices(&[(
                "/dev//null".into(),
                "/var/run/nvidia-container-devices/cdi/a/b/c/d".into()
            )]),
            ["a/b=c/d"]
        );
        // precedence: the runtime takes the annotations, the hook the mounts where the
        // node's toolkit reads them, else the variable
        let mut s = sources(
            &["nvidia.com/gpu=1"],
            &["/var/run/nvidia-container-devices/2"],
            Some("3"),
        );
        let [runtime, hook] = chosen(&s);
        assert_eq!(gpus(runtime), ["Index(1)"]);
        assert_eq!(gpus(hook), ["Index(3)"]);
        s.accept_mounts = true;
        let [_, hook] = chosen(&s);
        assert_eq!(gpus(hook), ["Index(2)"]);
        // an annotation of another vendor's device still takes the runtime's precedence
        let s = sources(&["vendor.com/nic=1"], &[], Some("3"));
        assert_eq!(chosen(&s)[0], Resolution::default());
        assert_eq!(
            gpus(devgate_spec(&s.spec().unwrap()).unwrap()),
            ["Index(3)"]
        );
    }

    /// A legacy CUDA image without the variable gets every GPU, whatever the device
    /// plugin's mounts say, unless the node's toolkit reads them
    /// (`accept-nvidia-visible-devices-as-volume-mounts`, default false). A devgate that
    /// read the mounts alone (before) fails the check; devgate now passes it both ways.
    #[test]
    fn a_legacy_image_with_mounts_gets_what_the_nodes_toolkit_gives() {
        let mut s = sources(&[], &["/var/run/nvidia-container-devices/0"], None);
        s.legacy_cuda = true;
        let [runtime, hook] = chosen(&s);
        assert!(runtime.all && hook.all, "{runtime:?} {hook:?}");
        let mut mounts_only = Resolution::default();
        mounts_only.add(GpuSelector::Index(0));
        assert!(!runtime.within(&mounts_only));
        check_sources(&s);
        assert!(s.devgate().unwrap().all);
        s.accept_mounts = true;
        let [runtime, _] = chosen(&s);
        assert!(!runtime.all && runtime.gpus.len() == 1, "{runtime:?}");
        check_sources(&s);
        assert_eq!(s.devgate().unwrap(), mounts_only);
    }

    /// The check itself fails on a reading that differs: an untrimmed reading of `2 `
    /// (devgate before v1.12's rules) names no GPU where the model names GPU 2.
    #[test]
    fn a_differing_reading_fails_the_check() {
        let mut untrimmed = Resolution::default();
        untrimmed.add(GpuSelector::Invalid("2 ".into()));
        assert!(!model("2 ").agrees(&untrimmed));
        assert!(model("2").agrees(&devgate("2").unwrap()));
        // a trimmed reading of an annotation (`nvidia.com/gpu= 2` as GPU 2) differs from
        // the model's, and so does one that reads a mount `1,2` as one refused name
        let s = sources(&["nvidia.com/gpu= 2"], &[], None);
        let mut trimmed = Resolution::default();
        trimmed.add(GpuSelector::Index(2));
        assert!(!annotations_model(&s.annotations).agrees(&trimmed));
        let s = sources(&[], &["/var/run/nvidia-container-devices/1,2"], None);
        let mut whole = Resolution::default();
        whole.add(GpuSelector::Invalid("1,2".into()));
        assert!(!mounts_model(&s.mounts).agrees(&whole));
        // and the precedence check fails on a reading that drops the chosen source
        let s = sources(&["nvidia.com/gpu=1"], &[], Some("3"));
        let mut variable_only = Resolution::default();
        variable_only.add(GpuSelector::Index(3));
        assert!(!chosen(&s)[0].within(&variable_only));
        assert!(chosen(&s)[0].within(&devgate_spec(&s.spec().unwrap()).unwrap()));
    }
}
