//! The toolkit's three sources of GPU requests together: CDI annotations, the device
//! plugin's volume mounts and the variable, and the precedence the toolkit takes them in,
//! beside the per-source reference models of [`super::toolkit_model`]. The fuzz target
//! `toolkit_sources` builds specs of all three ([`check_sources`]).

use super::toolkit_model::{annotation_devices, annotations_model, devgate_spec_with, model};
use super::toolkit_model::{mount_devices, mounts_model, Resolution};
use crate::gpu::request::ToolkitKeys;
use crate::oci::spec::Spec;
use std::collections::BTreeMap;

/// A spec's three sources as a container sets them, and the node's toolkit key that
/// decides between the mounts and the variable.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    pub annotations: BTreeMap<String, String>,
    /// (source, destination)
    pub mounts: Vec<(String, String)>,
    pub variable: Option<String>,
    /// `CUDA_VERSION` set, no `NVIDIA_REQUIRE_CUDA`: a legacy CUDA image (`IsLegacy`).
    pub legacy_cuda: bool,
    /// The node's `accept-nvidia-visible-devices-as-volume-mounts` (default false).
    pub accept_mounts: bool,
}

impl Sources {
    /// The sources a fuzz input names: NUL-separated entries, each a tag byte and its
    /// text (`fuzzing::toolkit_sources` says which tag is which).
    pub fn from_entries(text: &str) -> Sources {
        let mut s = Sources::default();
        for (i, entry) in text.split('\0').take(64).enumerate() {
            let Some(tag) = entry.chars().next() else {
                continue;
            };
            let rest = &entry[tag.len_utf8()..];
            match tag {
                'a' => drop(
                    s.annotations
                        .insert(format!("cdi.k8s.io/{i:02}"), rest.into()),
                ),
                'o' => drop(
                    s.annotations
                        .insert(format!("other.io/{i:02}"), rest.into()),
                ),
                'm' => s.mounts.push(("/dev/null".into(), rest.into())),
                'n' => s.mounts.push((
                    "/dev/null".into(),
                    format!("/var/run/nvidia-container-devices/{rest}"),
                )),
                's' => {
                    let (source, dest) = rest.split_once('\t').unwrap_or((rest, ""));
                    s.mounts.push((source.into(), dest.into()));
                }
                'e' if s.variable.is_none() => s.variable = Some(rest.into()),
                'c' => s.legacy_cuda = true,
                'A' => s.accept_mounts = true,
                _ => {}
            }
        }
        s
    }

    /// The spec they make, or `None` where config.json would not parse.
    pub fn spec(&self) -> Option<Spec> {
        let mounts: Vec<_> = self
            .mounts
            .iter()
            .map(|(s, d)| serde_json::json!({ "source": s, "destination": d, "type": "bind" }))
            .collect();
        let mut env: Vec<_> = self
            .variable
            .iter()
            .map(|v| format!("NVIDIA_VISIBLE_DEVICES={v}"))
            .collect();
        if self.legacy_cuda {
            env.push("CUDA_VERSION=12.2".into());
        }
        let json = serde_json::json!({
            "annotations": self.annotations,
            "mounts": mounts,
            "process": { "env": env },
        });
        Spec::parse(
            json.to_string().as_bytes(),
            std::path::Path::new("config.json"),
        )
        .ok()
    }

    fn only(&self, which: usize) -> Sources {
        Sources {
            annotations: if which == 0 {
                self.annotations.clone()
            } else {
                BTreeMap::new()
            },
            mounts: if which == 1 {
                self.mounts.clone()
            } else {
                Vec::new()
            },
            variable: if which == 2 {
                self.variable.clone()
            } else {
                None
            },
            legacy_cuda: false,
            accept_mounts: self.accept_mounts,
        }
    }

    /// devgate's reading of the spec, with the node's toolkit key as the source says.
    pub fn devgate(&self) -> Option<Resolution> {
        let accept = self.accept_mounts;
        let spec = self.spec()?;
        devgate_spec_with(&spec, Keys(accept))
    }
}

/// The variable selects (the toolkit's default); the mounts key as the node has it.
struct Keys(bool);

impl ToolkitKeys for Keys {
    fn env_selectors(&mut self) -> bool {
        true
    }
    fn volume_mounts(&mut self) -> bool {
        self.0
    }
}

/// The one source each of the toolkit's readers takes (`VisibleDevices`): the runtime the
/// annotations when a key has the prefix (a value splits to one device at least), else the
/// mounts when the node's `accept-nvidia-visible-devices-as-volume-mounts` is true and
/// they hand on a device, else the variable; the hook (legacy mode) the same without the
/// annotations. The variable as read when accepted (privileged, or
/// `accept-nvidia-visible-devices-envvar-when-unprivileged`); unset in a legacy CUDA image,
/// every GPU (`devicesFromEnvvars`).
pub fn chosen(s: &Sources) -> [Resolution; 2] {
    let variable = || match s.variable.as_deref() {
        Some(v) => model(v),
        None if s.legacy_cuda => model("all"),
        None => Resolution::default(),
    };
    let from_mounts = || {
        if !s.accept_mounts || mount_devices(&s.mounts).is_empty() {
            variable()
        } else {
            mounts_model(&s.mounts)
        }
    };
    let runtime = if annotation_devices(&s.annotations).is_empty() {
        from_mounts()
    } else {
        annotations_model(&s.annotations)
    };
    [runtime, from_mounts()]
}

/// The differential check over all three sources. Each source alone: devgate names exactly
/// the GPUs the model does. All together: what either of the toolkit's readers takes by
/// its precedence is within what devgate names, and not equal to it by design: devgate
/// reads every source, since which one the toolkit takes turns on its config and mode, and
/// containerd and CRI-O inject the annotations' devices themselves, so a GPU of any source
/// may reach the container.
pub fn check_sources(s: &Sources) {
    let models: [fn(&Sources) -> Resolution; 3] = [
        |s| annotations_model(&s.annotations),
        |s| mounts_model(&s.mounts),
        |s| s.variable.as_deref().map(model).unwrap_or_default(),
    ];
    for (which, m) in models.iter().enumerate() {
        let alone = s.only(which);
        let Some(d) = alone.devgate() else {
            continue;
        };
        let m = m(&alone);
        assert!(
            m.agrees(&d),
            "{alone:?}: toolkit model {m:?}, devgate {d:?}"
        );
    }
    if let Some(d) = s.devgate() {
        for c in chosen(s) {
            assert!(c.within(&d), "{s:?}: toolkit takes {c:?}, devgate {d:?}");
        }
    }
}
