//! The toolkit's three sources of GPU requests together: CDI annotations, the device
//! plugin's volume mounts and the variable, and the precedence the toolkit takes them in,
//! beside the per-source reference models of [`super::toolkit_model`]. The fuzz target
//! `toolkit_sources` builds specs of all three ([`check_sources`]).

use super::toolkit_model::{annotation_devices, annotations_model, devgate_spec, model};
use super::toolkit_model::{mount_devices, mounts_model, Resolution};
use crate::oci::spec::Spec;
use std::collections::BTreeMap;

/// A spec's three sources as a container sets them.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    pub annotations: BTreeMap<String, String>,
    /// (source, destination)
    pub mounts: Vec<(String, String)>,
    pub variable: Option<String>,
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
        let env: Vec<_> = self
            .variable
            .iter()
            .map(|v| format!("NVIDIA_VISIBLE_DEVICES={v}"))
            .collect();
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
        }
    }
}

/// The one source each of the toolkit's readers takes (`VisibleDevices`): the runtime the
/// annotations when a key has the prefix (a value splits to one device at least), else the
/// mounts when they hand on a device (`accept-nvidia-visible-devices-as-volume-mounts`),
/// else the variable; the hook (legacy mode) the mounts, else the variable. The variable
/// as read when accepted (privileged, or `accept-nvidia-visible-devices-envvar-when-unprivileged`).
pub fn chosen(s: &Sources) -> [Resolution; 2] {
    let variable = || s.variable.as_deref().map(model).unwrap_or_default();
    let from_mounts = || {
        if mount_devices(&s.mounts).is_empty() {
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
        let Some(d) = alone.spec().as_ref().and_then(devgate_spec) else {
            continue;
        };
        let m = m(&alone);
        assert!(
            m.agrees(&d),
            "{alone:?}: toolkit model {m:?}, devgate {d:?}"
        );
    }
    if let Some(d) = s.spec().as_ref().and_then(devgate_spec) {
        for c in chosen(s) {
            assert!(c.within(&d), "{s:?}: toolkit takes {c:?}, devgate {d:?}");
        }
    }
}
