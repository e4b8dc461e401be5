//! The NVML probe: what the NVIDIA driver says about each GPU assigned to a container.
//!
//! NVML never runs in the hook's own process. Each assigned GPU is asked about in a process
//! of its own ([`isolate`]), found by its PCI address from the driver's list
//! (`/proc/driver/nvidia/gpus`, [`super::driver`]) with nvmlDeviceGetHandleByPciBusId, so
//! no other GPU is touched ([`query`]). A GPU whose driver call hangs, often in an
//! uninterruptible ioctl, holds only its own process: the hook takes what the others
//! answered by the `probe_timeout_ms` deadline and leaves. What comes back is plain data, a
//! [`NvmlAnswer`] of each GPU's facts (`facts`); judging it ([`super::checks::checks`]) is
//! pure and is where every threshold lives.

pub(crate) mod child;
pub(crate) mod error;
pub(crate) mod facts;
pub(crate) mod isolate;
pub(crate) mod query;
pub(crate) mod stuck;
mod view;

pub use error::QueryError;
pub use facts::{display_bus_id, GpuCounters, GpuFacts, Link, Reading, LOST};

use super::driver::ProcGpu;
use super::pci::PciAddr;
use serde::{Serialize, Serializer};
use std::path::Path;
use std::time::{Duration, Instant};

/// How the GPUs in an answer were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lookup {
    /// By the driver's list (`/proc/driver/nvidia/gpus`): each GPU asked for by its PCI
    /// address, in a process of its own, and no other GPU touched.
    DriverList,
    /// By NVML enumerating every GPU in one process: only where the driver's list cannot
    /// be read, since nothing else then maps /dev/nvidiaN to a PCI address.
    Enumeration,
}

/// NVML's answer on a node: the GPUs asked about, or why NVML could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlAnswer {
    /// `Err` is the reason every GPU check is unknown (library missing, init failed, timeout).
    #[serde(serialize_with = "gpus_or_why")]
    pub gpus: Result<Vec<GpuFacts>, QueryError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub elapsed_us: u64,
    pub lookup: Lookup,
}

impl NvmlAnswer {
    /// Asks NVML about `gpus` (the driver's entries with their index in its list), each in
    /// its own process, within `timeout`; a GPU that does not answer by then is unknown
    /// on its own. The driver's minor, address and UUID stand whatever NVML answers. A GPU
    /// with a query still stuck from an earlier call (`stuck`) is not asked again.
    /// `meanwhile` runs while the children do.
    pub fn for_gpus(
        library: &Path,
        proc_root: &Path,
        timeout: Duration,
        gpus: &[(u32, ProcGpu)],
        stuck: &stuck::Stuck,
        meanwhile: impl FnOnce(),
    ) -> NvmlAnswer {
        let started = Instant::now();
        let mut answers: Vec<Option<Result<isolate::Answer, QueryError>>> = gpus
            .iter()
            .map(|(_, p)| stuck.still_stuck(&p.pci).map(Err))
            .collect();
        let ask: Vec<usize> = (0..gpus.len()).filter(|&i| answers[i].is_none()).collect();
        let jobs: Vec<isolate::Job> = ask
            .iter()
            .map(|&i| isolate::Job::Gpu {
                bus_id: gpus[i].1.nvml_bus_id(),
                index: gpus[i].0,
            })
            .collect();
        if jobs.is_empty() {
            meanwhile();
        } else {
            let asked = isolate::ask(library, proc_root, timeout, &jobs, meanwhile);
            for (&i, asked) in ask.iter().zip(asked) {
                if let Some(pid) = asked.stuck {
                    stuck.record(&gpus[i].1.pci, pid);
                }
                answers[i] = Some(asked.answer);
            }
        }
        let answers: Vec<Result<isolate::Answer, QueryError>> = answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(QueryError::NotAsked)))
            .collect();
        let (facts, driver_version, init) = merge(gpus, answers);
        if !gpus.is_empty() {
            log_times(started, init);
        }
        NvmlAnswer {
            gpus: facts,
            driver_version,
            elapsed_us: started.elapsed().as_micros() as u64,
            lookup: Lookup::DriverList,
        }
    }

    /// Every GPU NVML counts, read in one process within `timeout`: for a node whose
    /// driver list cannot be read. `meanwhile` runs while the child does.
    pub fn enumerate(
        library: &Path,
        proc_root: &Path,
        timeout: Duration,
        meanwhile: impl FnOnce(),
    ) -> NvmlAnswer {
        let started = Instant::now();
        let answer = isolate::ask(
            library,
            proc_root,
            timeout,
            &[isolate::Job::Every],
            meanwhile,
        )
        .pop()
        .map_or(Err(QueryError::NoAnswer), |a| a.answer);
        let (gpus, driver_version) = match answer {
            Ok(isolate::Answer::Gpus {
                driver_version,
                gpus,
                init_us,
                ..
            }) => {
                let init = InitTimes {
                    slowest_us: init_us,
                    total_us: init_us,
                };
                log_times(started, init);
                (Ok(gpus), driver_version)
            }
            Ok(isolate::Answer::Failed(e)) => (Err(QueryError::Failed(e)), None),
            Err(e) => (Err(e), None),
        };
        NvmlAnswer {
            gpus,
            driver_version,
            elapsed_us: started.elapsed().as_micros() as u64,
            lookup: Lookup::Enumeration,
        }
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuFacts> {
        self.gpus
            .as_ref()
            .ok()?
            .iter()
            .find(|g| g.minor.value() == Some(&minor))
    }

    /// NVML's changeable figures for /dev/nvidia`minor`, for the start snapshot and its
    /// poststop twin. None when NVML gave no answer at all (library missing, deadline):
    /// then no GPU fault can be claimed either way.
    pub fn counters(&self, minor: u32) -> Option<GpuCounters> {
        let gpus = self.gpus.as_ref().ok()?;
        let Some(g) = self.gpu_by_minor(minor) else {
            // NVML answered but no GPU has this minor any more: it fell off the bus.
            return (!gpus.is_empty()).then(GpuCounters::default);
        };
        let rows = g.remapped_rows.value();
        Some(GpuCounters {
            uuid: g.uuid.value().cloned(),
            pci_bus_id: g.pci_bus_id.value().cloned(),
            reachable: !g.is_lost(),
            ecc_volatile_uncorrectable: g.volatile_uncorrectable_ecc.value().copied(),
            remapped_rows_uncorrectable: rows.map(|r| u64::from(r.uncorrectable)),
            remap_failure: rows.is_some_and(|r| r.failure),
        })
    }

    /// The PCI address of the GPU behind /dev/nvidia`minor`, for attributing XID reports.
    pub fn pci_of_minor(&self, minor: u32) -> Option<PciAddr> {
        let g = self.gpu_by_minor(minor)?;
        PciAddr::parse(g.pci_bus_id.value()?)
    }
}

/// Each GPU's answer, with the driver's identity put in. NVML that could not be opened for
/// any GPU is one reason for all of them (the library is missing, or is not NVML); a GPU
/// whose process did not answer, or failed alone, is unknown on its own.
fn merge(
    gpus: &[(u32, ProcGpu)],
    answers: Vec<Result<isolate::Answer, QueryError>>,
) -> (Result<Vec<GpuFacts>, QueryError>, Option<String>, InitTimes) {
    let mut version = None;
    let mut init = InitTimes::default();
    let mut facts = Vec::with_capacity(gpus.len());
    let mut failures = Vec::new();
    for ((index, p), answer) in gpus.iter().zip(answers) {
        let mut f = match answer {
            Ok(isolate::Answer::Gpus {
                driver_version,
                gpus,
                init_us,
                unisolated,
            }) if gpus.len() == 1 => {
                if let Some(why) = unisolated {
                    log::info!(
                        "nvml: GPU {}: asked with every GPU in NVML's view, not alone: {why}",
                        p.pci
                    );
                }
                version = version.or(driver_version);
                init.slowest_us = init.slowest_us.max(init_us);
                init.total_us += init_us;
                gpus.into_iter()
                    .next()
                    .unwrap_or_else(|| unanswered(*index, "no answer"))
            }
            Ok(isolate::Answer::Gpus { gpus, .. }) => unanswered(
                *index,
                &format!(
                    "the NVML query process answered for {} GPUs, not 1",
                    gpus.len()
                ),
            ),
            Ok(isolate::Answer::Failed(e)) => {
                let f = unanswered(*index, &e);
                failures.push(QueryError::Failed(e));
                f
            }
            Err(e) => GpuFacts {
                unreachable_code: Some(e.code()),
                ..unanswered(*index, &e.to_string())
            },
        };
        f.index = *index;
        f.minor = Reading::Value(p.minor);
        f.pci_bus_id = Reading::Value(p.nvml_bus_id());
        if let (None, Some(u)) = (f.uuid.value(), &p.uuid) {
            f.uuid = Reading::Value(u.clone());
        }
        facts.push(f);
    }
    if !gpus.is_empty() && failures.len() == gpus.len() {
        return (Err(failures.swap_remove(0)), None, init);
    }
    (Ok(facts), version, init)
}

/// Time the query children spent loading the library and in nvmlInit, in µs: the slowest
/// one's, and all of theirs together (they run side by side, as many at once as the node
/// has free cores).
#[derive(Debug, Default, Clone, Copy)]
struct InitTimes {
    slowest_us: u64,
    total_us: u64,
}

/// For `DEVGATE_LOG=debug` and benches/nvml.sh: the NVML step's time, and how much the
/// children spent loading the library and in nvmlInit.
fn log_times(started: Instant, init: InitTimes) {
    log::debug!(
        "nvml: answered in {} us, NVML init {} us (slowest child), {} us (all children)",
        started.elapsed().as_micros(),
        init.slowest_us,
        init.total_us
    );
}

/// A GPU NVML gave no facts for: unknown, not lost.
fn unanswered(index: u32, why: &str) -> GpuFacts {
    GpuFacts::unreachable(index, why.to_string(), false)
}

/// `gpus` as it was written before the error was typed: `{"Ok": [...]}`, or `{"Err":
/// "why"}` with the reason's words.
fn gpus_or_why<S: Serializer>(
    gpus: &Result<Vec<GpuFacts>, QueryError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match gpus {
        Ok(g) => s.serialize_newtype_variant("Result", 0, "Ok", g),
        Err(e) => s.serialize_newtype_variant("Result", 1, "Err", &e.to_string()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::facts::{RemappedRows, MAX_GPUS};
    use super::*;

    pub fn healthy(index: u32) -> GpuFacts {
        GpuFacts {
            index,
            unreachable: None,
            unreachable_code: None,
            minor: Reading::Value(index),
            uuid: Reading::Value(format!("GPU-{index:08x}-0000-0000-0000-000000000000")),
            pci_bus_id: Reading::Value(format!("00000000:{:02X}:00.0", 0x1b + index * 0x10)),
            remapped_rows: Reading::Value(RemappedRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
            retired_pages_pending: Reading::Value(false),
            volatile_uncorrectable_ecc: Reading::Value(0),
            throttle_reasons: Reading::Value(0x1),
            pcie_gen: Reading::Value(Link { current: 4, max: 4 }),
            pcie_width: Reading::Value(Link {
                current: 16,
                max: 16,
            }),
            recovery_action: Reading::Value(0),
            drain: Reading::Value(false),
            pcie_replay: Reading::Value(0),
        }
    }

    fn proc_gpu(minor: u32, bus: u8) -> (u32, ProcGpu) {
        let pci = PciAddr::parse(&format!("0000:{bus:02x}:00.0")).unwrap();
        let uuid = Some(format!("GPU-{minor:08x}-1111-2222-3333-444444444444"));
        (minor, ProcGpu { minor, pci, uuid })
    }

    #[test]
    fn each_gpu_keeps_its_own_answer_and_the_drivers_identity() {
        use isolate::Answer;
        let gpus = [proc_gpu(0, 0x1b), proc_gpu(3, 0x86), proc_gpu(5, 0xd8)];
        let mut lost = GpuFacts::unreachable(9, LOST.into(), true);
        lost.uuid = Reading::Lost;
        let answers = vec![
            Ok(Answer::Gpus {
                driver_version: Some("550.54.15".into()),
                gpus: vec![healthy(7)],
                init_us: 0,
                unisolated: None,
            }),
            Err(QueryError::Timeout {
                ms: 2000,
                one_gpu: true,
            }),
            Ok(Answer::Gpus {
                driver_version: None,
                gpus: vec![lost],
                init_us: 0,
                unisolated: None,
            }),
        ];
        let (facts, version, _) = merge(&gpus, answers);
        let facts = facts.unwrap();
        assert_eq!(version.as_deref(), Some("550.54.15"));
        // the driver's minor and address stand, whatever NVML said
        assert_eq!(facts[0].minor, Reading::Value(0));
        assert_eq!(facts[0].pci_bus_id.value().unwrap(), "00000000:1B:00.0");
        assert!(!facts[0].is_lost());
        // the hung GPU is unknown, not lost, and says why
        assert!(!facts[1].is_lost());
        assert_eq!(
            facts[1].unreachable.as_deref(),
            Some("NVML did not answer for this GPU in 2000 ms")
        );
        assert_eq!(
            facts[1].label(),
            "GPU-00000003-1111-2222-3333-444444444444 (0000:86:00.0)"
        );
        // the lost one is lost, labelled by the driver's UUID and address
        assert!(facts[2].is_lost());
        assert_eq!(facts[2].minor, Reading::Value(5));
        assert_eq!(
            facts[2].label(),
            "GPU-00000005-1111-2222-3333-444444444444 (0000:d8:00.0)"
        );
    }

    #[test]
    fn nvml_that_opens_for_no_gpu_is_one_reason_for_all() {
        use isolate::Answer;
        let gpus = [proc_gpu(0, 0x1b), proc_gpu(1, 0x3b)];
        let why = "cannot load /nonexistent/libnvidia-ml.so.1: no such file";
        let all = vec![
            Ok(Answer::Failed(why.into())),
            Ok(Answer::Failed(why.into())),
        ];
        assert_eq!(
            merge(&gpus, all).0,
            Err(QueryError::Failed(why.to_string()))
        );
        // one GPU's failure is that GPU's alone
        let one = vec![
            Ok(Answer::Failed("NVML init failed (x): Unknown".into())),
            Ok(Answer::Gpus {
                driver_version: None,
                gpus: vec![healthy(1)],
                init_us: 0,
                unisolated: None,
            }),
        ];
        let facts = merge(&gpus, one).0.unwrap();
        assert_eq!(
            facts[0].unreachable.as_deref(),
            Some("NVML init failed (x): Unknown")
        );
        assert_eq!(facts[1].unreachable, None);
        // an answer for the wrong number of GPUs is the process's fault
        let two = vec![
            Ok(Answer::Gpus {
                driver_version: None,
                gpus: vec![healthy(0), healthy(1)],
                init_us: 0,
                unisolated: None,
            }),
            Err(QueryError::NoAnswer),
        ];
        let facts = merge(&gpus, two).0.unwrap();
        assert!(facts[0]
            .unreachable
            .as_deref()
            .unwrap()
            .contains("answered for 2 GPUs"));
    }

    #[test]
    fn a_child_that_writes_garbage_is_unknown_with_a_clear_reason() {
        use isolate::{decode, Answer, MAX_ANSWER};
        let crashed = decode(b"").unwrap_err();
        assert_eq!(crashed, QueryError::Crashed);
        assert_eq!(
            crashed.to_string(),
            "the NVML query process ended without an answer (it crashed)"
        );
        let malformed = decode(b"{\"gpus\": 1}").unwrap_err();
        assert!(
            matches!(malformed, QueryError::Malformed(_)),
            "{malformed:?}"
        );
        assert!(malformed.to_string().contains("malformed answer"));
        assert_eq!(
            decode(&vec![b' '; MAX_ANSWER + 1]).unwrap_err().to_string(),
            format!("the NVML query process wrote more than {MAX_ANSWER} bytes")
        );
        let a = Answer::Gpus {
            driver_version: Some("550.54.15".into()),
            gpus: vec![healthy(2), GpuFacts::unreachable(3, LOST.into(), true)],
            init_us: 0,
            unisolated: None,
        };
        let bytes = serde_json::to_vec(&a).unwrap();
        assert_eq!(decode(&bytes).unwrap(), a);
        // the replay counter as the query process writes it, and an answer without it
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/nvml_answer");
        let replay = |file: &str| match decode(&std::fs::read(seeds.join(file)).unwrap()) {
            Ok(Answer::Gpus { gpus, .. }) => gpus[0].pcie_replay.clone(),
            other => panic!("{file}: {other:?}"),
        };
        assert_eq!(replay("pcie-replay-counted.json"), Reading::Value(37));
        assert_eq!(
            replay("one-gpu-remap-pending.json"),
            Reading::NotSupported("not in the answer".into())
        );
        let f = Answer::Failed("cannot load x".into());
        assert_eq!(decode(&serde_json::to_vec(&f).unwrap()).unwrap(), f);
        let many = Answer::Gpus {
            driver_version: None,
            gpus: (0..=MAX_GPUS).map(healthy).collect(),
            init_us: 0,
            unisolated: None,
        };
        let e = decode(&serde_json::to_vec(&many).unwrap()).unwrap_err();
        assert_eq!(e, QueryError::AnsweredTooMany);
        assert!(e.to_string().contains("too many GPUs"), "{e}");
    }
}
