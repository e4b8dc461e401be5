//! A reference model of how the NVIDIA container toolkit reads `NVIDIA_VISIBLE_DEVICES`,
//! written apart from `discover::gpu` from the toolkit's source: `devicesFromEnvvars` in
//! `internal/config/image/cuda_image.go` and `NewVisibleDevices` in `devices.go` (v1.12.0
//! to v1.20), `DevicesFromEnvvars` at v1.11.0. The differential fuzz target
//! `toolkit_selectors` and the fixed corpus below hold devgate's reading equal to it.
//! Below the toolkit, nvidia-container-cli reads each device it is handed by glibc's rules:
//! that grammar is `selector::parse`, checked against glibc itself (`glibc_tests`).

use crate::discover::gpu::{gpu_selectors, MAX_SELECTORS};
use crate::discover::selector::{parse, GpuSelector};
use crate::oci::spec::Spec;
use std::collections::BTreeSet;

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

    fn add(&mut self, sel: GpuSelector) {
        match sel {
            GpuSelector::All => self.all = true,
            GpuSelector::Invalid(_) => self.unknown = true,
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

/// What one handed-on device names: the runtime's CDI mode takes a qualified name of one
/// of NVIDIA's GPU kinds as that CDI device; anything else goes to the cli.
fn names(device: &str) -> Option<GpuSelector> {
    let kinds = [
        "nvidia.com/gpu=",
        "k8s.device-plugin.nvidia.com/gpu=",
        "management.nvidia.com/gpu=",
    ];
    parse(
        kinds
            .iter()
            .find_map(|k| device.strip_prefix(k))
            .unwrap_or(device),
    )
    .map(as_named)
}

/// A UUID token holding white space begins no GPU's UUID (NVML's are hex and dashes), so
/// the cli refuses it as an unknown device; devgate keeps it as a UUID that NVML then
/// matches to none, an unknown too. Both sides of the check are read through this.
fn as_named(sel: GpuSelector) -> GpuSelector {
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
    let selectors = gpu_selectors(&spec);
    if selectors.len() > MAX_SELECTORS {
        return None;
    }
    let mut r = Resolution::default();
    for (s, _) in selectors {
        r.add(as_named(s));
    }
    Some(r)
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

    /// The check itself fails on a reading that differs: an untrimmed reading of `2 `
    /// (devgate before v1.12's rules) names no GPU where the model names GPU 2.
    #[test]
    fn a_differing_reading_fails_the_check() {
        let mut untrimmed = Resolution::default();
        untrimmed.add(GpuSelector::Invalid("2 ".into()));
        assert!(!model("2 ").agrees(&untrimmed));
        assert!(model("2").agrees(&devgate("2").unwrap()));
    }
}
