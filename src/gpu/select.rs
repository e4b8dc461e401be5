//! Which GPUs a container's selectors (`NVIDIA_VISIBLE_DEVICES`, CDI annotations) name,
//! resolved against the driver's list or NVML's enumeration.

use crate::gpu::driver::ProcGpu;
use crate::gpu::nvml::{NvmlAnswer, QueryError};
use crate::gpu::pci::PciAddr;
use crate::gpu::request::{GpuSelector, MAX_SELECTORS, NVIDIA_VISIBLE_DEVICES};
use crate::gpu::selector::uuid_names;
use crate::model::device::Source;

/// One GPU as selectors see it, in index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    pub minor: u32,
    pub uuid: Option<String>,
    /// For a PCI bus id selector.
    pub pci: Option<PciAddr>,
}

/// The GPUs selectors are resolved against, and who listed them; `Err` when nobody could.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownGpus {
    pub ids: Result<Vec<GpuId>, QueryError>,
    /// `NVML` or `the driver`, for the warnings.
    pub by: &'static str,
}

impl KnownGpus {
    /// Whether a GPU on the list has a UUID this selector names (as NVIDIA compares them:
    /// a prefix, ignoring case).
    pub fn knows_uuid(&self, uuid: &str) -> bool {
        self.ids.as_ref().is_ok_and(|ids| {
            ids.iter()
                .any(|g| g.uuid.as_deref().is_some_and(|v| uuid_names(uuid, v)))
        })
    }

    /// The driver's list, in PCI address order: NVML's own index order.
    pub fn from_driver(driver: &[(u32, ProcGpu)]) -> KnownGpus {
        KnownGpus {
            ids: Ok(driver
                .iter()
                .map(|(_, p)| GpuId {
                    minor: p.minor,
                    uuid: p.uuid.clone(),
                    pci: Some(p.pci),
                })
                .collect()),
            by: "the driver",
        }
    }

    /// NVML's enumeration. A GPU without a minor (lost) is taken at the driver's default
    /// numbering, index N = /dev/nvidiaN, so that it is still checked and found wanting
    /// rather than silently skipped.
    pub fn from_answer(answer: &NvmlAnswer) -> KnownGpus {
        KnownGpus {
            ids: answer.gpus.as_ref().map_err(Clone::clone).map(|gpus| {
                gpus.iter()
                    .map(|g| GpuId {
                        minor: g.minor.value().copied().unwrap_or(g.index),
                        uuid: g.uuid.value().cloned(),
                        pci: g.pci_bus_id.value().and_then(|b| PciAddr::parse(b)),
                    })
                    .collect()
            }),
            by: "NVML",
        }
    }
}

/// Whether a PCI bus id selector names this GPU: domain, bus and device, as
/// libnvidia-container compares `%08x:%02x:%02x.0` with the GPU's bus id.
fn bus_id_names(sel: &GpuSelector, g: &GpuId) -> bool {
    let GpuSelector::PciBusId {
        domain,
        bus,
        device,
        ..
    } = sel
    else {
        return false;
    };
    g.pci
        .is_some_and(|a| a.domain == *domain && a.bus == *bus && a.device == *device)
}

fn show_bus_id(sel: &GpuSelector) -> String {
    match sel {
        GpuSelector::PciBusId {
            domain,
            bus,
            device,
            ..
        } => format!("{domain:08x}:{bus:02x}:{device:02x}.0"),
        _ => String::new(),
    }
}

/// The minors a container's GPU selectors name, and a sentence for each one that names no
/// GPU. When no GPU list could be had, an index is taken at the driver's default numbering
/// and `all` means the `nvidiaN` nodes on the host (`nodes`), so that every GPU is still
/// checked.
pub fn resolve_selectors(
    selectors: &[(GpuSelector, Source)],
    known: &KnownGpus,
    nodes: &[u32],
) -> (Vec<(u32, Source)>, Vec<String>) {
    let list = ListWords::of(known);
    let mut r = Resolved::default();
    for (sel, source) in selectors {
        let how = match source {
            Source::CdiAnnotation => "CDI annotation",
            _ => NVIDIA_VISIBLE_DEVICES,
        };
        if *sel == GpuSelector::Unread {
            r.unresolved.push(format!(
                "{how} has more than {MAX_SELECTORS} distinct GPU selectors: the rest were not \
                 read, so every GPU is judged as named"
            ));
        }
        match (&known.ids, sel) {
            (_, GpuSelector::MigUuid(u)) => r.unresolved.push(format!(
                "{how} selects MIG device {u}, whose GPU devgate cannot tell (it does not list MIG devices)"
            )),
            (_, GpuSelector::Invalid(why)) => r.unresolved.push(format!(
                "{how} value {why}, which NVIDIA's tooling refuses"
            )),
            (Ok(gpus), _) => r.against_list(gpus, sel, *source, how, &list),
            (Err(why), _) => r.without_list(why, sel, *source, how, nodes),
        }
    }
    let Resolved {
        chosen,
        mut unresolved,
        ..
    } = r;
    if unresolved.len() > MAX_UNRESOLVED {
        let more = unresolved.len() - MAX_UNRESOLVED;
        unresolved.truncate(MAX_UNRESOLVED);
        unresolved.push(format!("and {more} more GPU selectors that name no GPU"));
    }
    (chosen, unresolved)
}

/// How the sentences name who listed the GPUs: "but NVML reports 2 GPUs", "which the
/// driver does not list".
struct ListWords {
    by: &'static str,
    says: &'static str,
    say: &'static str,
}

impl ListWords {
    fn of(known: &KnownGpus) -> ListWords {
        let (says, say) = if known.by == "NVML" {
            ("reports", "report")
        } else {
            ("lists", "list")
        };
        ListWords {
            by: known.by,
            says,
            say,
        }
    }
}

/// The selectors resolved so far: the minors chosen, in order, and the sentences.
#[derive(Default)]
struct Resolved {
    chosen: Vec<(u32, Source)>,
    unresolved: Vec<String>,
    /// Without a GPU list: the one index taken that has no `nvidiaN` node.
    missing: Option<u32>,
}

impl Resolved {
    fn add(&mut self, minor: u32, source: Source) {
        match self.chosen.iter_mut().find(|(m, _)| *m == minor) {
            // a GPU also named on its own is judged as named
            Some(c) if c.1 == Source::AllGpus => c.1 = source,
            Some(_) => {}
            None => self.chosen.push((minor, source)),
        }
    }

    /// A selector resolved against the GPU list.
    fn against_list(
        &mut self,
        gpus: &[GpuId],
        sel: &GpuSelector,
        source: Source,
        how: &str,
        list: &ListWords,
    ) {
        let ListWords { by, says, say } = list;
        match sel {
            GpuSelector::All => gpus.iter().for_each(|g| self.add(g.minor, Source::AllGpus)),
            // any GPU may be among the selectors not read: each is judged as named
            GpuSelector::Unread => gpus.iter().for_each(|g| self.add(g.minor, source)),
            GpuSelector::Index(i) => match gpus.get(*i as usize) {
                Some(g) => self.add(g.minor, source),
                None => self.unresolved.push(format!(
                    "{how} selects GPU {i} but {by} {says} {} GPUs",
                    gpus.len()
                )),
            },
            GpuSelector::Uuid(u) => {
                match gpus
                    .iter()
                    .find(|g| g.uuid.as_deref().is_some_and(|v| uuid_names(u, v)))
                {
                    Some(g) => self.add(g.minor, source),
                    None => self
                        .unresolved
                        .push(format!("{how} selects {u}, which {by} does not {say}")),
                }
            }
            // No GPU at the bus id: the cli reads the token again as `<gpu>:<mig>`.
            GpuSelector::PciBusId { or_mig, .. } => {
                match (gpus.iter().find(|g| bus_id_names(sel, g)), or_mig) {
                    (Some(g), _) => self.add(g.minor, source),
                    (None, Some((gpu, instance))) => {
                        let mig = GpuSelector::Mig {
                            gpu: *gpu,
                            instance: *instance,
                        };
                        self.against_list(gpus, &mig, source, how, list)
                    }
                    (None, None) => self.unresolved.push(format!(
                        "{how} selects PCI bus id {}, which {by} does not {say}",
                        show_bus_id(sel)
                    )),
                }
            }
            // A MIG instance runs on its parent GPU: that is what is checked.
            GpuSelector::Mig { gpu, instance } => match gpus.get(*gpu as usize) {
                Some(g) => self.add(g.minor, source),
                None => self.unresolved.push(format!(
                    "{how} selects MIG device {gpu}:{instance} but {by} {says} {} GPUs",
                    gpus.len()
                )),
            },
            // No list places these: [`resolve_selectors`] says so for both.
            GpuSelector::MigUuid(_) | GpuSelector::Invalid(_) => {}
        }
    }

    /// A selector resolved with no GPU list (`why` there is none), at the driver's default
    /// numbering.
    fn without_list(
        &mut self,
        why: &QueryError,
        sel: &GpuSelector,
        source: Source,
        how: &str,
        nodes: &[u32],
    ) {
        match sel {
            GpuSelector::All => nodes.iter().for_each(|n| self.add(*n, Source::AllGpus)),
            GpuSelector::Unread => nodes.iter().for_each(|n| self.add(*n, source)),
            // At the default numbering, one index without its node is checked and found
            // wanting; more of them would each cost a walk of dev_root and a device in the
            // record and the reject line (a spec can hold 1024), deciding nothing more.
            GpuSelector::Index(i) | GpuSelector::Mig { gpu: i, .. } => {
                if nodes.contains(i) || *self.missing.get_or_insert(*i) == *i {
                    self.add(*i, source)
                } else {
                    self.unresolved.push(format!(
                        "{how} selects GPU {i}, which has no node /dev/nvidia{i} and cannot be \
                         placed without a GPU list"
                    ))
                }
            }
            GpuSelector::Uuid(u) => self
                .unresolved
                .push(format!("{how} selects {u}, which cannot be checked: {why}")),
            // Either reading may be the cli's: the bus id's GPU is not known, the MIG
            // device's parent is taken at the default numbering.
            GpuSelector::PciBusId { or_mig, .. } => {
                self.unresolved.push(format!(
                    "{how} selects PCI bus id {}, which cannot be checked: {why}",
                    show_bus_id(sel)
                ));
                if let Some((gpu, instance)) = or_mig {
                    let mig = GpuSelector::Mig {
                        gpu: *gpu,
                        instance: *instance,
                    };
                    self.without_list(why, &mig, source, how, nodes)
                }
            }
            // No list places these: [`resolve_selectors`] says so for both.
            GpuSelector::MigUuid(_) | GpuSelector::Invalid(_) => {}
        }
    }
}

/// Sentences said about selectors that name no GPU, past which they are counted: each is a
/// warning line, a clause of the reject line, and part of the record and the decision log
/// line of every retry of the pod.
pub(crate) const MAX_UNRESOLVED: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::tests::healthy;
    use crate::gpu::nvml::{GpuFacts, Lookup, Reading};

    /// NVML's answer listing `gpus`, by enumeration.
    fn answer(gpus: Vec<GpuFacts>) -> NvmlAnswer {
        NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        }
    }

    /// A spec naming hundreds of GPUs no list has gets a bounded reason, not one sentence
    /// each: the reject line, its record and the decision log line stay small however many
    /// times a pod is retried.
    #[test]
    fn unresolved_selectors_are_said_a_bounded_number_of_times() {
        let ok = answer((0..2).map(healthy).collect());
        let sel: Vec<(GpuSelector, Source)> = (0..100)
            .map(|i| {
                (
                    GpuSelector::Uuid(format!("GPU-ffff{i:04}")),
                    Source::NvidiaVisibleDevices,
                )
            })
            .collect();
        let (chosen, unresolved) = resolve_selectors(&sel, &KnownGpus::from_answer(&ok), &[]);
        assert!(chosen.is_empty());
        assert_eq!(unresolved.len(), MAX_UNRESOLVED + 1, "{unresolved:?}");
        assert_eq!(
            unresolved.last().unwrap(),
            &format!(
                "and {} more GPU selectors that name no GPU",
                100 - MAX_UNRESOLVED
            )
        );
    }

    /// libnvidia-container takes a `GPU-` token as a prefix of the UUID, any case, and
    /// gives the first GPU in index order that it begins: so must devgate, or the pod gets
    /// that GPU unchecked (`strncasecmp(uuid, token, strlen(token))` in `select_devices`).
    #[test]
    fn a_uuid_selector_names_the_first_gpu_its_prefix_begins() {
        let mut gpus: Vec<GpuFacts> = (0..3).map(healthy).collect();
        gpus[2].minor = Reading::Value(7);
        let ok = answer(gpus);
        let known = KnownGpus::from_answer(&ok);
        let env = Source::NvidiaVisibleDevices;
        assert!(known.knows_uuid("gpu-00000002-00"));
        let (chosen, unresolved) = resolve_selectors(
            &[
                (GpuSelector::Uuid("gpu-00000002-00".into()), env),
                // GPUs 0, 1 and 2 all begin so: the first in index order
                (GpuSelector::Uuid("GPU-0000000".into()), env),
                // longer than the UUID: no GPU
                (
                    GpuSelector::Uuid("GPU-00000001-0000-0000-0000-0000000000000".into()),
                    env,
                ),
            ],
            &known,
            &[],
        );
        assert_eq!(chosen, vec![(7, env), (0, env)]);
        assert_eq!(unresolved.len(), 1, "{unresolved:?}");
    }

    /// nvidia-container-cli's `select_devices` reads a token as a GPU (UUID, PCI bus id,
    /// index) and, where none has it, as a MIG device: a bus id no GPU has falls through to
    /// `sscanf("%lu:%lu")`, so `1:0:0` is MIG device 1:0, handed over with its parent GPU 1.
    /// The attacker's spellings each reach a GPU that way; one a GPU has is that GPU alone.
    #[test]
    fn a_bus_id_no_gpu_has_falls_through_to_the_mig_device_as_the_cli_reads_it() {
        let ok = answer((0..3).map(healthy).collect());
        let known = KnownGpus::from_answer(&ok);
        let env = Source::NvidiaVisibleDevices;
        for (token, gpu) in [
            ("1:0:0", 1),
            ("0:1:ff", 0),
            ("+1:0:0", 1),
            ("1:2:-1", 1),
            (" 2:0:0.0", 2),
            // no GPU at bus 0x4b: MIG 0:4 on GPU 0
            ("0:4b:00.0", 0),
            // GPU 1's own bus id: GPU 1, not MIG 0:2
            ("0:2b:00.0", 1),
        ] {
            let sel = crate::gpu::selector::parse(token).unwrap();
            let (chosen, unresolved) = resolve_selectors(&[(sel, env)], &known, &[]);
            assert_eq!(chosen, vec![(gpu, env)], "{token:?}: {unresolved:?}");
            assert!(unresolved.is_empty(), "{token:?}: {unresolved:?}");
        }
        // without a GPU list: the bus id cannot be checked, its MIG reading's parent is
        let failed = KnownGpus {
            ids: Err(crate::gpu::nvml::QueryError::Failed("cannot load x".into())),
            by: "NVML",
        };
        let sel = crate::gpu::selector::parse("1:0:0").unwrap();
        let (chosen, unresolved) = resolve_selectors(&[(sel, env)], &failed, &[0, 1]);
        assert_eq!(chosen, vec![(1, env)]);
        assert_eq!(unresolved.len(), 1, "{unresolved:?}");
    }

    /// Long because it resolves several selector lists against one NVML answer, then against
    /// a failed one; the cases share the setup.
    #[test]
    fn selectors_resolve_through_nvml_or_default_numbering() {
        let mut gpus: Vec<GpuFacts> = (0..3).map(healthy).collect();
        gpus[1].minor = Reading::Value(5);
        gpus[2] = GpuFacts::unreachable(2, "GPU is lost".into(), true);
        let ok = answer(gpus);
        let env = Source::NvidiaVisibleDevices;
        let cdi = Source::CdiAnnotation;
        let sel = vec![
            (GpuSelector::Index(1), env),
            (
                GpuSelector::Uuid("gpu-00000000-0000-0000-0000-000000000000".into()),
                cdi,
            ),
            (GpuSelector::Index(2), env),
            (GpuSelector::Index(9), env),
            (GpuSelector::Uuid("GPU-nope".into()), cdi),
            (GpuSelector::Index(1), cdi),
        ];
        let (chosen, unresolved) = resolve_selectors(&sel, &KnownGpus::from_answer(&ok), &[]);
        assert_eq!(chosen, vec![(5, env), (0, cdi), (2, env)]);
        assert_eq!(
            unresolved,
            vec![
                "NVIDIA_VISIBLE_DEVICES selects GPU 9 but NVML reports 3 GPUs".to_string(),
                "CDI annotation selects GPU-nope, which NVML does not report".to_string()
            ]
        );
        let (chosen, _) = resolve_selectors(
            &[(GpuSelector::All, env)],
            &KnownGpus::from_answer(&ok),
            &[],
        );
        let all = Source::AllGpus;
        assert_eq!(chosen, vec![(0, all), (5, all), (2, all)]);
        // a GPU also named on its own is judged as named
        let (chosen, _) = resolve_selectors(
            &[(GpuSelector::All, env), (GpuSelector::Index(2), cdi)],
            &KnownGpus::from_answer(&ok),
            &[],
        );
        assert_eq!(chosen, vec![(0, all), (5, all), (2, cdi)]);

        let failed = NvmlAnswer {
            gpus: Err(crate::gpu::nvml::QueryError::Failed("cannot load x".into())),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let (chosen, unresolved) = resolve_selectors(
            &[
                (GpuSelector::All, env),
                (GpuSelector::Index(4), env),
                (GpuSelector::Uuid("GPU-1".into()), env),
            ],
            &KnownGpus::from_answer(&failed),
            &[0, 1],
        );
        assert_eq!(chosen, vec![(0, all), (1, all), (4, env)]);
        assert_eq!(
            unresolved,
            vec!["NVIDIA_VISIBLE_DEVICES selects GPU-1, which cannot be checked: cannot load x"]
        );
    }

    /// The bound on distinct selectors (`request::MAX_SELECTORS`) is reached by specs the
    /// toolkit takes whole. libnvidia-container reads a token shaped like a bus id that no
    /// GPU has again as `<gpu>:<mig>` (`select_mig_device`), so `0:0:00` … `0:3:ff` are 1024
    /// distinct selectors, each MIG device 0:0 to 0:3 of GPU 0 to the cli; and the device
    /// plugin's mounts are read whether or not the toolkit reads them (its default is not
    /// to), so 1024 mounts name 1024 indexes the toolkit never sees. Either way the GPU the
    /// container really gets, named after them, must still be judged as named: reading
    /// stopped at the bound and the rest was one unknown, which `policy.on_unknown`'s
    /// default allows, so GPU 2 started unchecked.
    #[test]
    fn a_flood_of_selectors_does_not_leave_the_gpu_after_it_unchecked() {
        use crate::oci::spec::Spec;
        use std::path::Path;
        let ok = answer((0..3).map(healthy).collect());
        let known = KnownGpus::from_answer(&ok);
        let spec = |j: serde_json::Value| {
            Spec::parse(j.to_string().as_bytes(), Path::new("/b/config.json")).unwrap()
        };
        let mig_flood: String = (0..4)
            .flat_map(|m| (0..=255).map(move |d| format!("0:{m}:{d:02x},")))
            .collect();
        let env_only = spec(serde_json::json!({
            "process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={mig_flood}2")]}
        }));
        let mounts: Vec<_> = (0..1024)
            .map(|i| {
                serde_json::json!({
                    "destination": format!("/var/run/nvidia-container-devices/{}", i + 100),
                    "source": "/dev/null", "type": "bind", "options": ["bind"]
                })
            })
            .collect();
        let with_mounts = spec(serde_json::json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=2"]},
            "mounts": mounts
        }));
        for (what, s) in [
            ("MIG fall-through", env_only),
            ("unread mounts", with_mounts),
        ] {
            let sel = crate::gpu::request::gpu_selectors(&s);
            let (chosen, unresolved) = resolve_selectors(&sel, &known, &[]);
            assert!(
                chosen.contains(&(2, Source::NvidiaVisibleDevices)),
                "{what}: GPU 2 is not judged as named: {:?} {:?}",
                &chosen[chosen.len().saturating_sub(3)..],
                unresolved.last()
            );
        }
    }

    /// Without a GPU list (NVML failing, no driver list: a driver that did not load) each
    /// index was taken as a GPU at the default numbering: `NVIDIA_VISIBLE_DEVICES=0,…,1023`
    /// made 1024 devices, each a walk of dev_root (15 s of one hook with a 2000-node
    /// dev_root, debug build) and a clause of an 870 KB record's reject line. One index
    /// with no node still decides the start; the others are sentences, counted past 16.
    #[test]
    fn without_a_gpu_list_indexes_with_no_node_are_not_each_a_device() {
        let env = Source::NvidiaVisibleDevices;
        let failed = KnownGpus {
            ids: Err(crate::gpu::nvml::QueryError::Failed("cannot load x".into())),
            by: "NVML",
        };
        let mut sel: Vec<_> = (0..1024).map(|i| (GpuSelector::Index(i), env)).collect();
        sel.push((
            GpuSelector::Mig {
                gpu: 2,
                instance: 1,
            },
            env,
        ));
        let (chosen, unresolved) = resolve_selectors(&sel, &failed, &[0, 1]);
        assert_eq!(chosen, vec![(0, env), (1, env), (2, env)]);
        assert_eq!(unresolved.len(), MAX_UNRESOLVED + 1, "{unresolved:?}");
        assert_eq!(
            unresolved[0],
            "NVIDIA_VISIBLE_DEVICES selects GPU 3, which has no node /dev/nvidia3 and cannot be \
             placed without a GPU list"
        );
        assert_eq!(
            unresolved[MAX_UNRESOLVED],
            "and 1005 more GPU selectors that name no GPU"
        );
    }
}
