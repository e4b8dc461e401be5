//! The PCIe link probe: what an idle GPU does not change. GPUs (and NICs, NVMe drives)
//! drop their link generation when idle to save power, so a link at 2.5 GT/s of 32 says
//! nothing; devgate never judges the generation. It judges:
//!
//! - the link width: narrower than both the function and its upstream port (the slot, or
//!   the switch port above it) support means lanes failed to train. It warns.
//! - the AER counters (`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`) of the
//!   function and of its upstream port, which sees errors the endpoint cannot report. They
//!   count since boot, so each is judged against the baseline devgate stored at the last
//!   container start (`store::pcie`), never by its absolute value:
//!   a fatal error since the baseline is unhealthy, and stays so until the counters restart
//!   (the function removed and added again: a reboot, a hot-plug) or the operator removes
//!   the baseline file; a non-fatal or correctable error since the baseline warns once, and
//!   the baseline moves past it. Counters that restarted since the baseline are judged
//!   against zero: all they count happened after it.
//! - for a GPU, NVML's PCIe replay counter (link-level retransmissions: the link recovered
//!   from an error by sending again, which AER counts as correctable). Also counted since
//!   the driver loaded, it is kept in the same baseline and judged like a correctable error:
//!   a rise warns once. A GPU or driver that does not report it (NOT_SUPPORTED, any NVML
//!   error) leaves it not judged: a note, never unknown.
//!
//! Sysfs is outside input: every read is bounded (`read_attr`), and a file that does not
//! parse makes the verdict unknown, naming the file and the function.

mod aer;
mod rules;
pub(crate) mod seen;

pub use aer::{parse_aer, read_aer};
pub use rules::{advance, judge_aer, judge_replay};
pub use seen::FunctionSeen;

use crate::fsutil::read_attr;
use crate::gpu::nvml::{Reading, LOST};
use crate::gpu::GpuContext;
use crate::model::class::Class;
use crate::model::clock;
use crate::model::device::Device;
use crate::model::verdict::{Code, Verdict};
use crate::probe::findings::{Findings, Probe};
use crate::probe::sysfs;
use crate::store::pcie::{self as baseline};
use aer::shorten;
use rules::next_baseline;
use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};

/// No PCIe link is wider than x32; the kernel reads x63 (all ones) from a function that
/// no longer answers config reads.
const MAX_WIDTH: u32 = 32;
fn name_of(pci: &Path) -> String {
    pci.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The port above a function: its parent directory when that is a PCI function too (a
/// root port or a switch's downstream port); a function on a root bus has none.
pub fn upstream_port(pci: &Path) -> Option<PathBuf> {
    let parent = pci.parent()?;
    let sub = fs::read_link(parent.join("subsystem")).ok()?;
    (sub.file_name()? == "pci").then(|| parent.to_path_buf())
}

/// The PCI function behind a device: through sysfs's device model, or for an NVIDIA GPU
/// (whose `/dev/nvidiaN` has no sysfs entry) through the bus id NVML (else the driver's
/// /proc list) gives for its minor.
pub fn function_dir(
    sysfs_root: &Path,
    device: &Device,
    gpu: Option<&GpuContext>,
) -> Option<PathBuf> {
    // A GPU first: its node has no sysfs entry, and the device-model walk costs a realpath.
    if device.class == Class::NvidiaGpu {
        return gpu_function(sysfs_root, device, gpu?);
    }
    sysfs::pci_dir_for(sysfs_root, device)
}

fn gpu_function(sysfs_root: &Path, device: &Device, gpu: &GpuContext) -> Option<PathBuf> {
    let mut addr = gpu.pci_of_minor(device.num.minor)?;
    addr.function.get_or_insert(0);
    // The kernel's link is relative (`../../../devices/…`): resolved by name, no realpath.
    let d = sysfs::resolve(&sysfs_root.join("bus/pci/devices").join(addr.to_string())).ok()?;
    // Only an NVIDIA function is the GPU: a bus id that names another vendor's device
    // (NVML and sysfs disagreeing, or a fake NVML on a test machine) judges nothing.
    let vendor = read_attr(&d.join("vendor")).ok()?;
    (vendor == NVIDIA_VENDOR).then_some(d)
}

const NVIDIA_VENDOR: &str = "0x10de";

fn read_width(dir: &Path, file: &str) -> Option<Result<u32, NotAWidth>> {
    let t = read_attr(&dir.join(file)).ok()?;
    Some(t.parse::<u32>().map_err(|_| NotAWidth(shorten(&t))))
}

/// A link width file's text, shortened, where it is not a number.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NotAWidth(String);

impl std::fmt::Display for NotAWidth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "link width {:?} is not a number", self.0)
    }
}

impl std::error::Error for NotAWidth {}

/// The link width against what both ends support. Generation is not judged (see above).
pub fn judge_width(pci: &Path, up: Option<&Path>) -> Verdict {
    let name = name_of(pci);
    let (Some(cur), Some(max)) = (
        read_width(pci, "current_link_width"),
        read_width(pci, "max_link_width"),
    ) else {
        return Verdict::not_applicable(Code::NotReported, "no link width");
    };
    let (cur, max) = match (cur, max) {
        (Ok(c), Ok(m)) => (c, m),
        (c, m) => {
            return Verdict::unknown(
                Code::PcieUnreadable,
                format!(
                    "cannot parse link width {:?} / {:?} of {name}",
                    c.map_or_else(|e| e.0, |v| v.to_string()),
                    m.map_or_else(|e| e.0, |v| v.to_string())
                ),
            )
        }
    };
    if cur > MAX_WIDTH {
        return Verdict::unhealthy(
            Code::PcieNoResponse,
            format!(
                "PCIe link of {name} reads x{cur}, which no link is: the function does not answer config reads"
            ),
        );
    }
    if cur == 0 {
        return Verdict::unknown(
            Code::PcieLinkUntrained,
            format!("PCIe link of {name} is not trained (x0)"),
        );
    }
    let port = up.and_then(|u| match read_width(u, "max_link_width") {
        Some(Ok(w)) if (1..=MAX_WIDTH).contains(&w) => Some((w, name_of(u))),
        _ => None,
    });
    let supported = port.as_ref().map_or(max, |(w, _)| max.min(*w));
    if cur >= supported {
        return Verdict::Healthy;
    }
    let detail = match port {
        Some((w, u)) => format!(
            "PCIe link of {name} is x{cur}, below the x{supported} it (x{max}) and its upstream port {u} (x{w}) support"
        ),
        None => format!("PCIe link of {name} is x{cur}, below its maximum x{max}"),
    };
    Verdict::warn(Code::PcieLinkDegraded, detail)
}

impl FunctionSeen {
    /// Reads the function's stored baseline and then its AER counters. `replay` is NVML's
    /// reading for a GPU's function (taken earlier, in the query process: a baseline
    /// another gate moved past it meanwhile reads as a counter that went down, which only
    /// retakes the count, so a later rise warns again, never less).
    pub fn read(dir: &Path, state_dir: &Path, replay: Option<Reading<u32>>) -> FunctionSeen {
        let name = name_of(dir);
        // The baseline before the counters: a baseline is written from counts read before
        // it, and counts only grow, so counts read after it are never below it unless the
        // counters restarted. Read the other way round, a gate on the same function at the
        // same time (a GPU two pods share) could write a newer baseline in between, and
        // counts below it read as a restart: a fatal rise passed and was retaken past.
        let baseline = baseline::read(state_dir, &name);
        FunctionSeen {
            dir: dir.to_path_buf(),
            name,
            aer: read_aer(dir),
            replay,
            baseline,
        }
    }

    /// The AER verdict on what was read, and the replay counter's for a GPU's function.
    fn judge(&self) -> Vec<Verdict> {
        let name = &self.name;
        let base = self.baseline.as_ref().map(Option::as_ref);
        let aer_read = matches!(self.aer, Some(Ok(_)));
        let mut out = vec![match (&self.aer, base) {
            (None, _) => Verdict::not_applicable(Code::NotReported, "no AER counters"),
            (Some(Err(e)), _) => Verdict::unknown(
                Code::PcieUnreadable,
                format!("cannot read AER counters of {name}: {e}"),
            ),
            (Some(Ok(_)), Err(e)) => Verdict::unknown(Code::PcieBaselineDamaged, e.to_string()),
            (Some(Ok(now)), Ok(b)) => judge_aer(name, now, b),
        }];
        match (&self.replay, base) {
            (None, _) => {}
            (Some(Reading::Value(n)), Ok(b)) => out.push(judge_replay(name, u64::from(*n), b)),
            // A damaged baseline is said once, by the AER verdict when it read one.
            (Some(Reading::Value(_)), Err(_)) if aer_read => {}
            (Some(Reading::Value(_)), Err(e)) => {
                out.push(Verdict::unknown(Code::PcieBaselineDamaged, e.to_string()))
            }
            (Some(other), _) => out.push(Verdict::not_applicable(
                Code::NotReported,
                format!(
                    "PCIe replay counter of {name} not judged: {}",
                    why_not(other)
                ),
            )),
        }
        out
    }
}

/// Why NVML gave no replay count.
fn why_not(r: &Reading<u32>) -> String {
    match r {
        Reading::NotSupported(why) | Reading::Failed(why) => why.clone(),
        Reading::Lost => LOST.into(),
        Reading::Value(_) => String::new(),
    }
}

/// The functions behind a device as the probe reads them, the device's own first, then its
/// upstream port; empty when it has none. For a device the probe did not run on.
pub fn read_functions(
    sysfs_root: &Path,
    state_dir: &Path,
    device: &Device,
    gpu: Option<&GpuContext>,
) -> Vec<FunctionSeen> {
    let Some(pci) = function_dir(sysfs_root, device, gpu) else {
        return Vec::new();
    };
    let up = upstream_port(&pci);
    let mut seen = vec![FunctionSeen::read(&pci, state_dir, replay_of(device, gpu))];
    seen.extend(up.map(|u| FunctionSeen::read(&u, state_dir, None)));
    seen
}

/// NVML's replay counter reading for a GPU.
fn replay_of(device: &Device, gpu: Option<&GpuContext>) -> Option<Reading<u32>> {
    if device.class != Class::NvidiaGpu {
        return None;
    }
    let facts = gpu?.nvml.gpu_by_minor(device.num.minor)?;
    Some(facts.pcie_replay.clone())
}

pub struct PcieProbe<'a> {
    pub sysfs_root: PathBuf,
    pub state_dir: PathBuf,
    /// For a GPU's PCI address.
    pub gpu: Option<&'a GpuContext>,
    /// The functions read in this probe pass: a port above several devices is read once.
    seen: RefCell<Vec<FunctionSeen>>,
}

impl<'a> PcieProbe<'a> {
    pub fn new(sysfs_root: &Path, state_dir: &Path, gpu: Option<&'a GpuContext>) -> Self {
        PcieProbe {
            sysfs_root: sysfs_root.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            gpu,
            seen: RefCell::new(Vec::new()),
        }
    }

    fn see(&self, dir: &Path, replay: Option<Reading<u32>>) -> FunctionSeen {
        let mut seen = self.seen.borrow_mut();
        match seen.iter_mut().find(|s| s.dir == dir) {
            // Read first for a device of the GPU's function that is not the GPU (its DRM
            // node), which has no replay count: the GPU's own is added, not lost.
            Some(s) => {
                if s.replay.is_none() {
                    s.replay = replay;
                }
                s.clone()
            }
            None => {
                let s = FunctionSeen::read(dir, &self.state_dir, replay);
                seen.push(s.clone());
                s
            }
        }
    }

    /// The device's PCI function: a GPU's through its bus id; another device's as the
    /// sysfs probe found it, else through sysfs's device model.
    fn function(&self, device: &Device, found: &Findings) -> Option<PathBuf> {
        match &found.device_pci {
            Some(pci) if device.class != Class::NvidiaGpu => pci.clone(),
            _ => function_dir(&self.sysfs_root, device, self.gpu),
        }
    }
}

impl Probe for PcieProbe<'_> {
    fn name(&self) -> &'static str {
        "pcie"
    }

    fn check(&self, device: &Device, found: &mut Findings) -> Verdict {
        let Some(pci) = self.function(device, found) else {
            found.pcie = Some(Vec::new());
            return Verdict::not_applicable(Code::NoPciFunction, "no PCI function");
        };
        let up = upstream_port(&pci);
        let mut findings = vec![judge_width(&pci, up.as_deref())];
        let mut seen = vec![self.see(&pci, replay_of(device, self.gpu))];
        seen.extend(up.map(|u| self.see(&u, None)));
        findings.extend(seen.iter().flat_map(FunctionSeen::judge));
        found.pcie = Some(seen);
        // Named like the xid and nvml reasons, so a reject line says which check spoke.
        match Verdict::worst(findings) {
            Verdict::NotApplicable(_) => Verdict::Healthy,
            v @ (Verdict::Warn(_) | Verdict::Unhealthy(_)) => v.prefixed("pcie: "),
            v => v,
        }
    }
}

/// After a gate: moves the baselines of the functions behind `judged` and their upstream
/// ports (`advance`) to what the probe read of them (`Findings::pcie`), so that an error
/// counted after that read is a rise at the next start. A device the probe did not run on
/// (a spare the remap put in) is read now, and only a first baseline is taken for it: the
/// remap's probe of a spare tells no one of a warning, so a stored baseline moved past its
/// rise would have warned no one, ever. A failure is logged, never fails the start: the
/// baseline is for the next start's judgement.
pub fn advance_baselines(
    sysfs_root: &Path,
    state_dir: &Path,
    judged: &[(&Device, Option<&Findings>)],
    gpu: Option<&GpuContext>,
) {
    let (now_unix, _) = clock::now();
    // Each function once, and whether this gate's probe judged it.
    let mut functions: Vec<(FunctionSeen, bool)> = Vec::new();
    for (d, found) in judged {
        let (seen, probed) = match found.and_then(|f| f.pcie.as_ref()) {
            Some(s) => (s.clone(), true),
            None => (read_functions(sysfs_root, state_dir, d, gpu), false),
        };
        for f in seen {
            match functions.iter_mut().find(|(k, _)| k.name == f.name) {
                // One function, one baseline: the reading with the GPU's replay count
                // stands over another device's of the same function (its DRM node's).
                Some((k, was)) if k.replay.is_none() && f.replay.is_some() => {
                    *k = f;
                    *was |= probed;
                }
                Some((_, was)) => *was |= probed,
                None => functions.push((f, probed)),
            }
        }
    }
    for (f, probed) in &functions {
        if !probed && matches!(f.baseline, Ok(Some(_))) {
            continue;
        }
        // A damaged file is replaced: the probe said so at this start.
        let old = f.baseline.as_ref().ok().and_then(Option::as_ref);
        if let Some(b) = next_baseline(f, old, now_unix) {
            if let Err(e) = baseline::write(state_dir, &b) {
                log::error!("cannot keep the PCIe baseline of {}: {e}", f.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::aer::{AerError, AerFault};
    use super::*;
    use crate::model::device::{DevNum, DevType};
    use crate::probe::sysfs::tests::Tree;
    use crate::store::pcie::{AerCounts, PcieBaseline, ReplayCount};
    use std::os::unix::fs::symlink;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sysfs-aer");

    fn fixture(name: &str) -> String {
        fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap()
    }

    #[test]
    fn real_aer_files_parse_in_both_kernel_formats() {
        assert_eq!(
            parse_aer(&fixture("v4.19-aer_dev_correctable"), "TOTAL_ERR_COR"),
            Ok(2)
        );
        assert_eq!(
            parse_aer(&fixture("v4.19-aer_dev_fatal"), "TOTAL_ERR_FATAL"),
            Ok(0)
        );
        assert_eq!(
            parse_aer(&fixture("v6-aer_dev_correctable"), "TOTAL_ERR_COR"),
            Ok(0)
        );
        assert_eq!(
            parse_aer(&fixture("v6-aer_dev_nonfatal"), "TOTAL_ERR_NONFATAL"),
            Ok(3)
        );
        assert_eq!(
            parse_aer(&fixture("v6-aer_dev_fatal"), "TOTAL_ERR_FATAL"),
            Ok(1)
        );
        // an unnamed bit as later kernels print it; no total: the lines are summed
        assert_eq!(
            parse_aer("RxErr 1\ncor_errs_bit[9] 2\n", "TOTAL_ERR_COR"),
            Ok(3)
        );
    }

    #[test]
    fn malformed_aer_files_are_errors_with_context() {
        for (text, want) in [
            ("", "empty"),
            ("RxErr lots\n", "bad count \"lots\" for \"RxErr\""),
            ("12\n", "unexpected line \"12\""),
            ("RxErr -1\n", "bad count \"-1\""),
            ("RxErr 99999999999999999999999\n", "bad count"),
        ] {
            let e = parse_aer(text, "TOTAL_ERR_COR").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // a hostile or broken tree: an endless file is read to its bound and refused
        let t = Tree::new("pcie-huge");
        let f = t.pci("0000:3b:00.0", true);
        t.write(&f, "aer_dev_fatal", &"x".repeat(100_000));
        assert!(matches!(
            read_aer(&f),
            Some(Err(AerError::Parse {
                file: "aer_dev_fatal",
                fault: AerFault::UnexpectedLine(_)
            }))
        ));
        t.write(&f, "aer_dev_fatal", "TOTAL_ERR_FATAL 0\n");
        t.write(&f, "aer_dev_nonfatal", &"RxErr 1\n".repeat(10_000));
        let e = read_aer(&f).unwrap().unwrap_err();
        assert_eq!(
            e,
            AerError::Parse {
                file: "aer_dev_nonfatal",
                fault: AerFault::TooManyLines { max: 64 }
            }
        );
        assert_eq!(e.to_string(), "aer_dev_nonfatal: more than 64 lines");
        fs::remove_dir_all(&t.0).unwrap();
        let many = "RxErr 0\n".repeat(100);
        assert_eq!(
            parse_aer(&many, "TOTAL_ERR_COR"),
            Err(AerFault::TooManyLines { max: 64 })
        );
    }

    fn counts(c: u64, n: u64, f: u64) -> AerCounts {
        AerCounts {
            correctable: c,
            nonfatal: n,
            fatal: f,
        }
    }

    fn base(c: u64, n: u64, f: u64) -> PcieBaseline {
        PcieBaseline {
            function: "0000:3b:00.0".into(),
            time_unix: 1_796_223_098,
            aer: Some(counts(c, n, f)),
            replay: None,
        }
    }

    #[test]
    fn aer_is_judged_by_its_change_never_its_absolute_value() {
        let f = "0000:3b:00.0";
        // first sight: whatever the counts, nothing to judge yet
        assert_eq!(judge_aer(f, &counts(50, 7, 3), None), Verdict::Healthy);
        // unchanged since the baseline, however high
        assert_eq!(
            judge_aer(f, &counts(50, 7, 3), Some(&base(50, 7, 3))),
            Verdict::Healthy
        );
        assert_eq!(
            judge_aer(f, &counts(50, 7, 4), Some(&base(50, 7, 3))),
            Verdict::unhealthy(
                Code::AerFatal,
                "PCIe AER: 1 fatal error on 0000:3b:00.0 since 2026-12-02T14:51:38Z (3 -> 4)"
            )
        );
        assert_eq!(
            judge_aer(f, &counts(52, 7, 3), Some(&base(50, 7, 3))),
            Verdict::warn(
                Code::AerCorrectable,
                "PCIe AER: 2 correctable errors on 0000:3b:00.0 since 2026-12-02T14:51:38Z (50 -> 52)"
            )
        );
        let v = judge_aer(f, &counts(50, 8, 3), Some(&base(50, 7, 3)));
        assert_eq!((v.status(), v.code()), ("warn", Some(Code::AerNonfatal)));
        // counters below the baseline restarted: a reboot or reset, not a judgement
        assert_eq!(
            judge_aer(f, &counts(0, 0, 0), Some(&base(50, 7, 3))),
            Verdict::Healthy
        );
    }

    #[test]
    fn the_baseline_moves_past_warnings_but_not_past_a_fatal_rise() {
        assert_eq!(advance(&counts(5, 1, 2), None), counts(5, 1, 2));
        assert_eq!(
            advance(&counts(9, 4, 2), Some(&counts(5, 1, 2))),
            counts(9, 4, 2)
        );
        // the fatal rise stays a rise at the next start
        assert_eq!(
            advance(&counts(9, 4, 3), Some(&counts(5, 1, 2))),
            counts(9, 4, 2)
        );
        // counters restarted: retaken, but for a fatal count since, which stays a rise
        assert_eq!(
            advance(&counts(0, 0, 1), Some(&counts(5, 1, 0))),
            counts(0, 0, 0)
        );
        assert_eq!(
            advance(&counts(3, 1, 0), Some(&counts(5, 1, 2))),
            counts(3, 1, 0)
        );
    }

    /// A counter file that is there but cannot be read (an I/O error, a function going
    /// away under the read) is no count, not a zero: read as zero, it made the counts look
    /// restarted, so a fatal count already in the baseline read as new (a healthy device
    /// rejected, for good) or, before restarts were judged, a fatal rise passed. Only a file
    /// that is not there counts zero (a kernel that reports the fatal count alone).
    #[test]
    fn an_aer_file_that_cannot_be_read_is_unknown_never_zero() {
        let t = Tree::new("pcie-unreadable");
        let f = t.pci("0000:3b:00.0", true);
        let state = t.0.join("state");
        let b0 = PcieBaseline {
            aer: Some(counts(5, 0, 1)),
            ..base(0, 0, 0)
        };
        baseline::write(&state, &b0).unwrap();
        t.write(&f, "aer_dev_fatal", "TOTAL_ERR_FATAL 1\n");
        t.write(&f, "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL 0\n");
        // reading a directory fails (EISDIR) where opening it does not
        fs::create_dir(f.join("aer_dev_correctable")).unwrap();
        let seen = FunctionSeen::read(&f, &state, None);
        let v = Verdict::worst(seen.judge());
        assert_eq!(v.code(), Some(Code::PcieUnreadable), "{v:?}");
        assert_eq!(v.status(), "unknown", "{v:?}");
        assert!(v.detail().unwrap().contains("aer_dev_correctable"), "{v:?}");
        let found = Findings {
            pcie: Some(vec![seen]),
            ..Findings::default()
        };
        advance_baselines(&t.0, &state, &[(&gpu_device(), Some(&found))], None);
        assert_eq!(baseline::read(&state, "0000:3b:00.0").unwrap(), Some(b0));
        // a file that is not there counts zero
        fs::remove_dir(f.join("aer_dev_correctable")).unwrap();
        fs::remove_file(f.join("aer_dev_nonfatal")).unwrap();
        assert_eq!(read_aer(&f), Some(Ok(counts(0, 0, 1))));
        // nor is an unreadable fatal count "no AER counters": that passed as not applicable
        fs::remove_file(f.join("aer_dev_fatal")).unwrap();
        fs::create_dir(f.join("aer_dev_fatal")).unwrap();
        assert!(
            matches!(
                read_aer(&f),
                Some(Err(AerError::Read {
                    file: "aer_dev_fatal",
                    ..
                }))
            ),
            "{:?}",
            read_aer(&f)
        );
        assert!(read_aer(&f)
            .unwrap()
            .unwrap_err()
            .to_string()
            .starts_with("aer_dev_fatal: cannot read: "));
        fs::remove_dir_all(&t.0).unwrap();
    }

    /// Counters below the baseline restarted after it was taken (the function was removed
    /// and added again: a link that dropped and came back, a hot-plug, a reboot with
    /// state_dir kept): all they count happened since the baseline. A broken device whose
    /// link drops and retrains, then reports a fatal error, must not pass because its
    /// correctable count is now below the stored one; and the rise keeps counting.
    #[test]
    fn a_fatal_error_counted_after_the_counters_restarted_is_a_rise() {
        let f = "0000:3b:00.0";
        let v = judge_aer(f, &counts(0, 0, 1), Some(&base(50, 7, 0)));
        assert_eq!(v.status(), "unhealthy", "{v:?}");
        assert_eq!(v.code(), Some(Code::AerFatal));
        assert!(
            v.detail()
                .unwrap()
                .ends_with("1 fatal error on 0000:3b:00.0 since 2026-12-02T14:51:38Z (counters restarted: 0 -> 1)"),
            "{v:?}"
        );
        assert_eq!(
            judge_aer(f, &counts(2, 0, 0), Some(&base(50, 7, 0))).status(),
            "warn"
        );
        let next = advance(&counts(0, 0, 1), Some(&counts(50, 7, 0)));
        assert_eq!(next, counts(0, 0, 0), "the fatal rise stays a rise");
        assert_eq!(
            judge_aer(f, &counts(0, 0, 1), Some(&base(0, 0, 0))).status(),
            "unhealthy"
        );
    }

    /// devices/pci0000:00/0000:00:01.0 (a root port) / 0000:3b:00.0 (the GPU), and
    /// bus/pci/devices/0000:3b:00.0 pointing at it, as the kernel lays them out.
    fn gpu_tree(tag: &str) -> (Tree, PathBuf, PathBuf) {
        let t = Tree::new(tag);
        let port = t.pci("0000:00:01.0", true);
        let gpu = port.join("0000:3b:00.0");
        fs::create_dir_all(&gpu).unwrap();
        symlink("../../../../bus/pci", gpu.join("subsystem")).unwrap();
        t.write(&gpu, "vendor", "0x10de\n");
        fs::create_dir_all(t.0.join("bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:3b:00.0",
            t.0.join("bus/pci/devices/0000:3b:00.0"),
        )
        .unwrap();
        (t, port, gpu)
    }

    fn gpu_device() -> Device {
        Device::linux_gpu(1)
    }

    use crate::gpu::driver::ProcGpu;
    use crate::gpu::nvml::NvmlAnswer;

    fn nvml_with_gpu1_at_3b() -> NvmlAnswer {
        let mut g = crate::gpu::nvml::tests::healthy(1);
        g.pci_bus_id = crate::gpu::nvml::Reading::Value("00000000:3B:00.0".into());
        NvmlAnswer {
            gpus: Ok(vec![crate::gpu::nvml::tests::healthy(0), g]),
            driver_version: None,
            elapsed_us: 0,
            lookup: crate::gpu::nvml::Lookup::Enumeration,
        }
    }

    fn ctx(nvml: NvmlAnswer, proc: Vec<ProcGpu>) -> GpuContext {
        GpuContext {
            nvml,
            proc_gpus: proc,
            kmsg: Err(crate::gpu::kmsg::KmsgError::new(
                crate::gpu::kmsg::KmsgStep::Read,
                Path::new("/dev/kmsg"),
                std::io::Error::from_raw_os_error(libc::EIO),
            )),
            xid_table: Default::default(),
            limits: crate::gpu::checks::Limits {
                max_volatile_uncorrectable_ecc: 0,
            },
            cluster_taints: crate::store::cluster::TaintsOnce::new(Path::new(
                "/nonexistent/devgate-test",
            )),
        }
    }

    #[test]
    fn width_counts_what_both_ends_support_and_generation_not_at_all() {
        let (t, port, gpu) = gpu_tree("pcie-width");
        t.write(&gpu, "current_link_speed", "2.5 GT/s PCIe\n");
        t.write(&gpu, "max_link_speed", "32.0 GT/s PCIe\n");
        t.write(&gpu, "current_link_width", "16\n");
        t.write(&gpu, "max_link_width", "16\n");
        t.write(&port, "max_link_width", "16\n");
        // an idle GPU at gen 1 of 5: healthy
        assert_eq!(judge_width(&gpu, Some(&port)), Verdict::Healthy);
        t.write(&gpu, "current_link_width", "8\n");
        assert_eq!(
            judge_width(&gpu, Some(&port)),
            Verdict::warn(
                Code::PcieLinkDegraded,
                "PCIe link of 0000:3b:00.0 is x8, below the x16 it (x16) and its upstream port 0000:00:01.0 (x16) support"
            )
        );
        // an x16 card in a slot wired x8: x8 is all it can be
        t.write(&port, "max_link_width", "8\n");
        assert_eq!(judge_width(&gpu, Some(&port)), Verdict::Healthy);
        assert_eq!(
            judge_width(&gpu, None),
            Verdict::warn(
                Code::PcieLinkDegraded,
                "PCIe link of 0000:3b:00.0 is x8, below its maximum x16"
            )
        );
        // a function that stopped answering reads all ones
        t.write(&gpu, "current_link_width", "63\n");
        let v = judge_width(&gpu, Some(&port));
        assert_eq!(v.status(), "unhealthy");
        assert_eq!(v.code(), Some(Code::PcieNoResponse));
        t.write(&gpu, "current_link_width", "wide\n");
        assert_eq!(
            judge_width(&gpu, Some(&port)),
            Verdict::unknown(
                Code::PcieUnreadable,
                "cannot parse link width \"wide\" / \"16\" of 0000:3b:00.0"
            )
        );
        fs::remove_dir_all(&t.0).unwrap();
    }

    #[test]
    fn a_gpu_is_found_through_nvml_and_judged_against_the_stored_baseline() {
        let (t, port, gpu) = gpu_tree("pcie-probe");
        let state = t.0.join("state");
        for (dir, fatal) in [(&gpu, 0), (&port, 0)] {
            t.write(
                dir,
                "aer_dev_correctable",
                &fixture("v6-aer_dev_correctable"),
            );
            t.write(
                dir,
                "aer_dev_fatal",
                &format!("DLP {fatal}\nTOTAL_ERR_FATAL {fatal}\n"),
            );
        }
        let gpu_ctx = ctx(nvml_with_gpu1_at_3b(), Vec::new());
        let d = gpu_device();
        // one probe pass per start, as probe_all makes it
        let check = |gpu: Option<&GpuContext>| {
            let mut found = Findings::default();
            let v = PcieProbe::new(&t.0, &state, gpu).check(&d, &mut found);
            (v, found)
        };
        let judge = || check(Some(&gpu_ctx)).0;
        assert_eq!(judge(), Verdict::Healthy);
        // a bus id that names another vendor's function is not the GPU
        t.write(&gpu, "vendor", "0x8086\n");
        assert_eq!(judge().status(), "not_applicable");
        t.write(&gpu, "vendor", "0x10de\n");
        // no GPU context: a GPU's function cannot be found
        assert_eq!(check(None).0.status(), "not_applicable");
        // NVML stuck or missing: the driver's /proc list still names the function
        let stuck = NvmlAnswer {
            gpus: Err(crate::gpu::nvml::QueryError::Timeout {
                ms: 2000,
                one_gpu: false,
            }),
            driver_version: None,
            elapsed_us: 0,
            lookup: crate::gpu::nvml::Lookup::Enumeration,
        };
        let proc_only = ctx(
            stuck,
            vec![ProcGpu {
                minor: 1,
                pci: crate::gpu::pci::PciAddr::parse("0000:3b:00.0").unwrap(),
                uuid: None,
            }],
        );
        assert_eq!(
            function_dir(&t.0, &d, Some(&proc_only)).map(|f| fs::canonicalize(f).unwrap()),
            Some(fs::canonicalize(&gpu).unwrap())
        );
        // the first gate takes the baselines of the GPU and its port (read then, as for a
        // spare the probe did not run on)
        advance_baselines(&t.0, &state, &[(&d, None)], Some(&gpu_ctx));
        assert!(state.join("pcie/0000:3b:00.0.json").is_file());
        assert!(state.join("pcie/0000:00:01.0.json").is_file());
        // a garbled file is unknown, naming it
        t.write(&gpu, "aer_dev_correctable", "RxErr x\n");
        let v = judge();
        assert!(
            v.detail().unwrap().contains(
                "cannot read AER counters of 0000:3b:00.0: aer_dev_correctable: bad count"
            ),
            "{v:?}"
        );
        t.write(
            &gpu,
            "aer_dev_correctable",
            &fixture("v6-aer_dev_correctable"),
        );
        assert_eq!(judge(), Verdict::Healthy);
        // the port saw a fatal error since: unhealthy, named
        t.write(&port, "aer_dev_fatal", "DLP 1\nTOTAL_ERR_FATAL 1\n");
        let v = judge();
        assert!(
            matches!(&v, Verdict::Unhealthy(r) if r.code == Code::AerFatal
                && r.detail.starts_with("pcie: PCIe AER: 1 fatal error on 0000:00:01.0 since ")),
            "{v:?}"
        );
        // and stays so at the next start, its "since" unmoved by a later correctable error
        // (taken long ago, so that "now" cannot pass for it)
        let mut taken = baseline::read(&state, "0000:00:01.0").unwrap().unwrap();
        taken.time_unix = 1000;
        baseline::write(&state, &taken).unwrap();
        t.write(&port, "aer_dev_correctable", "RxErr 1\nTOTAL_ERR_COR 1\n");
        let (v, found) = check(Some(&gpu_ctx));
        assert_eq!(v.status(), "unhealthy");
        advance_baselines(&t.0, &state, &[(&d, Some(&found))], Some(&gpu_ctx));
        assert_eq!(judge().status(), "unhealthy");
        let kept = baseline::read(&state, "0000:00:01.0").unwrap().unwrap();
        assert_eq!(kept.aer.unwrap().correctable, 1);
        assert_eq!(
            (kept.aer.unwrap().fatal, kept.time_unix),
            (0, taken.time_unix)
        );

        // The baseline moves to what the probe read and judged, not to a later read: an
        // error counted between the probe and the move is a rise at the next start, never
        // passed unwarned. (The move reads no AER file: the probe's reading is all it has.)
        fs::remove_file(state.join("pcie/0000:00:01.0.json")).unwrap();
        t.write(&port, "aer_dev_fatal", "DLP 0\nTOTAL_ERR_FATAL 0\n");
        let (v, found) = check(Some(&gpu_ctx));
        assert_eq!(v, Verdict::Healthy);
        let seen = found.pcie.as_ref().unwrap();
        assert_eq!(
            seen.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["0000:3b:00.0", "0000:00:01.0"]
        );
        t.write(&gpu, "aer_dev_correctable", "RxErr 5\nTOTAL_ERR_COR 5\n");
        advance_baselines(&t.0, &state, &[(&d, Some(&found))], Some(&gpu_ctx));
        let moved = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(moved.aer.unwrap().correctable, 0);
        let v = judge();
        assert!(
            v.detail()
                .unwrap()
                .starts_with("pcie: PCIe AER: 5 correctable errors on 0000:3b:00.0 since "),
            "{v:?}"
        );
        fs::remove_dir_all(&t.0).unwrap();
    }

    #[test]
    fn the_pcie_probe_takes_the_function_the_sysfs_probe_found() {
        let (t, _port, func) = gpu_tree("pcie-found");
        t.write(&func, "current_link_width", "8\n");
        t.write(&func, "max_link_width", "16\n");
        // a device with no sysfs entry of its own: only the finding names its function
        let d = Device {
            class: "char".into(),
            ..gpu_device()
        };
        let p = PcieProbe::new(&t.0, &t.0.join("state"), None);
        let mut found = Findings::default();
        assert_eq!(p.check(&d, &mut found).status(), "not_applicable");
        assert_eq!(found.pcie, Some(Vec::new()));
        let mut found = Findings {
            device_pci: Some(Some(func.clone())),
            ..Findings::default()
        };
        let v = PcieProbe::new(&t.0, &t.0.join("state"), None).check(&d, &mut found);
        assert!(
            v.detail()
                .unwrap()
                .starts_with("pcie: PCIe link of 0000:3b:00.0 is x8"),
            "{v:?}"
        );
        // the sysfs probe found none: none, without a walk of its own
        let mut found = Findings {
            device_pci: Some(None),
            ..Findings::default()
        };
        let v = PcieProbe::new(&t.0, &t.0.join("state"), None).check(&d, &mut found);
        assert_eq!(
            v,
            Verdict::not_applicable(Code::NoPciFunction, "no PCI function")
        );
        fs::remove_dir_all(&t.0).unwrap();
    }

    fn with_replay(c: u64, time_unix: u64) -> PcieBaseline {
        PcieBaseline {
            replay: Some(ReplayCount {
                count: c,
                time_unix,
            }),
            ..base(0, 0, 0)
        }
    }

    #[test]
    fn the_replay_counter_is_judged_by_its_rise_never_its_value() {
        let f = "0000:3b:00.0";
        // first sight, or a baseline from before the counter was kept: nothing to judge
        assert_eq!(judge_replay(f, 900, None), Verdict::Healthy);
        assert_eq!(judge_replay(f, 900, Some(&base(0, 0, 0))), Verdict::Healthy);
        assert_eq!(
            judge_replay(f, 900, Some(&with_replay(900, 1))),
            Verdict::Healthy
        );
        assert_eq!(
            judge_replay(f, 905, Some(&with_replay(900, 1_796_223_098))),
            Verdict::warn(
                Code::PcieReplay,
                "PCIe replay counter: 5 replays on 0000:3b:00.0 since 2026-12-02T14:51:38Z (900 -> 905)"
            )
        );
        assert_eq!(
            judge_replay(f, 1, Some(&with_replay(0, 1_796_223_098)))
                .detail()
                .unwrap(),
            "PCIe replay counter: 1 replay on 0000:3b:00.0 since 2026-12-02T14:51:38Z (0 -> 1)"
        );
        // below the baseline: the driver reloaded or the GPU was reset
        assert_eq!(
            judge_replay(f, 3, Some(&with_replay(900, 1))),
            Verdict::Healthy
        );
    }

    fn seen(aer: Option<AerCounts>, replay: Option<Reading<u32>>) -> FunctionSeen {
        FunctionSeen {
            dir: PathBuf::from("/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.0"),
            name: "0000:3b:00.0".into(),
            aer: aer.map(Ok),
            replay,
            baseline: Ok(None),
        }
    }

    #[test]
    fn the_replay_baseline_moves_past_every_rise_and_apart_from_the_aer_counts() {
        // first sight: taken now, AER or not (a GPU in a VM has no AER files)
        let b = next_baseline(&seen(None, Some(Reading::Value(7))), None, 100).unwrap();
        assert_eq!(
            (b.aer, b.replay.map(|r| (r.count, r.time_unix))),
            (None, Some((7, 100)))
        );
        // unchanged: nothing to write
        assert_eq!(
            next_baseline(&seen(None, Some(Reading::Value(7))), Some(&b), 200),
            None
        );
        // a rise moves it, with its own time; the AER time stays where it was
        let old = PcieBaseline {
            time_unix: 50,
            ..with_replay(7, 60)
        };
        let n = next_baseline(
            &seen(Some(counts(0, 0, 0)), Some(Reading::Value(9))),
            Some(&old),
            300,
        )
        .unwrap();
        assert_eq!(
            n.replay,
            Some(ReplayCount {
                count: 9,
                time_unix: 300
            })
        );
        assert_eq!((n.aer, n.time_unix), (Some(counts(0, 0, 0)), 50));
        // a fatal AER rise stays a rise while the replay count moves on
        let n = next_baseline(
            &seen(Some(counts(0, 0, 1)), Some(Reading::Value(12))),
            Some(&old),
            300,
        )
        .unwrap();
        assert_eq!((n.aer.unwrap().fatal, n.time_unix), (0, 50));
        assert_eq!(n.replay.unwrap().count, 12);
        // not supported, or NVML failed: the stored count is kept as it was
        for r in [
            Reading::NotSupported("not supported".into()),
            Reading::Failed("Unknown".into()),
        ] {
            let n = next_baseline(&seen(Some(counts(0, 0, 0)), Some(r)), Some(&old), 300);
            assert_eq!(n, None);
        }
        // nothing counted at all: no file
        assert_eq!(next_baseline(&seen(None, None), None, 300), None);
    }

    #[test]
    fn a_gpus_replay_counter_rise_warns_once_and_unsupported_is_a_note() {
        let (t, port, gpu) = gpu_tree("pcie-replay");
        let state = t.0.join("state");
        for dir in [&gpu, &port] {
            t.write(dir, "aer_dev_fatal", "TOTAL_ERR_FATAL 0\n");
        }
        let d = gpu_device();
        let start = |replay: Reading<u32>| {
            let mut nvml = nvml_with_gpu1_at_3b();
            nvml.gpus.as_mut().unwrap()[1].pcie_replay = replay;
            let g = ctx(nvml, Vec::new());
            let mut found = Findings::default();
            let v = PcieProbe::new(&t.0, &state, Some(&g)).check(&d, &mut found);
            advance_baselines(&t.0, &state, &[(&d, Some(&found))], Some(&g));
            (v, found)
        };
        // the first start takes the count, however high
        assert_eq!(start(Reading::Value(40)).0, Verdict::Healthy);
        let b = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(b.replay.map(|r| r.count), Some(40));
        // the port's baseline has no replay count: NVML's counter is the GPU's
        let p = baseline::read(&state, "0000:00:01.0").unwrap().unwrap();
        assert_eq!(p.replay, None);
        // replays since: one warning, then the baseline has moved past them
        let (v, _) = start(Reading::Value(43));
        assert!(
            v.detail()
                .unwrap()
                .starts_with("pcie: PCIe replay counter: 3 replays on 0000:3b:00.0 since "),
            "{v:?}"
        );
        assert_eq!(v.status(), "warn");
        assert_eq!(start(Reading::Value(43)).0, Verdict::Healthy);
        // not supported, or an NVML error: not judged, a note and never unknown; the
        // stored count stays for when NVML answers again
        for (r, why) in [
            (
                Reading::NotSupported("not supported".into()),
                "not supported",
            ),
            (Reading::Failed("Unknown Error".into()), "Unknown Error"),
            (Reading::Lost, LOST),
        ] {
            let (v, found) = start(r);
            assert_eq!(v, Verdict::Healthy);
            let judged = found.pcie.unwrap()[0].judge();
            let note = format!("PCIe replay counter of 0000:3b:00.0 not judged: {why}");
            let note = Verdict::not_applicable(Code::NotReported, note);
            assert!(judged.contains(&note), "{judged:?}");
        }
        let b = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(b.replay.map(|r| r.count), Some(43));
        assert!(start(Reading::Value(44)).0.status() == "warn");
        fs::remove_dir_all(&t.0).unwrap();
    }

    /// A spare the remap put in was probed by the remap, whose warnings reach no one; the
    /// gate reads it again after the remap. Moving its stored baseline to that reading
    /// passed its correctable and replay rises without a word, for good. Only a first
    /// baseline is taken for it; a stored one waits for a gate that judges the spare.
    #[test]
    fn a_spare_the_probe_did_not_judge_keeps_its_stored_baseline() {
        let (t, _port, gpu) = gpu_tree("pcie-spare");
        let state = t.0.join("state");
        t.write(&gpu, "aer_dev_fatal", "TOTAL_ERR_FATAL 0\n");
        t.write(&gpu, "aer_dev_correctable", "TOTAL_ERR_COR 7\n");
        let mut nvml = nvml_with_gpu1_at_3b();
        nvml.gpus.as_mut().unwrap()[1].pcie_replay = Reading::Value(43);
        let g = ctx(nvml, Vec::new());
        let d = gpu_device();
        // no baseline yet: the spare's first is taken
        advance_baselines(&t.0, &state, &[(&d, None)], Some(&g));
        let first = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(first.aer.map(|a| a.correctable), Some(7));
        // rises since: not moved past without a judgement
        t.write(&gpu, "aer_dev_correctable", "TOTAL_ERR_COR 9\n");
        let mut nvml = nvml_with_gpu1_at_3b();
        nvml.gpus.as_mut().unwrap()[1].pcie_replay = Reading::Value(45);
        let g = ctx(nvml, Vec::new());
        advance_baselines(&t.0, &state, &[(&d, None)], Some(&g));
        assert_eq!(baseline::read(&state, "0000:3b:00.0").unwrap(), Some(first));
        // the next gate that probes it warns, and then moves it
        let mut found = Findings::default();
        let v = PcieProbe::new(&t.0, &state, Some(&g)).check(&d, &mut found);
        assert_eq!(v.status(), "warn", "{v:?}");
        let why = v.detail().unwrap();
        assert!(
            why.contains("2 correctable errors") && why.contains("2 replays"),
            "{why}"
        );
        advance_baselines(&t.0, &state, &[(&d, Some(&found))], Some(&g));
        let moved = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(
            (
                moved.aer.map(|a| a.correctable),
                moved.replay.map(|r| r.count)
            ),
            (Some(9), Some(45))
        );
        fs::remove_dir_all(&t.0).unwrap();
    }

    /// Two gates on one function at once (a GPU shared by time-slicing, two devices under
    /// one port): one writes a baseline between the other's counter read and its baseline
    /// read. Then the counts read look lower than the baseline, like counters that
    /// restarted, and a fatal rise counted before both was passed and its baseline retaken
    /// past it. The counters must be read after the baseline, never before. The other gate
    /// is a thread that writes its baseline when the counters are opened (a FIFO for
    /// `aer_dev_fatal`), so the order is the test's, not timing's.
    /// Long because the FIFO, the other gate's thread and the baseline it moves are one
    /// ordered race, set up, run and checked in one place.
    #[test]
    fn a_baseline_written_by_a_concurrent_gate_never_hides_a_fatal_rise() {
        let t = Tree::new("pcie-race");
        let f = t.pci("0000:3b:00.0", true);
        let state = t.0.join("state");
        let b0 = PcieBaseline {
            function: "0000:3b:00.0".into(),
            time_unix: 1,
            aer: Some(counts(5, 0, 0)),
            replay: None,
        };
        baseline::write(&state, &b0).unwrap();
        t.write(&f, "aer_dev_correctable", "TOTAL_ERR_COR 5\n");
        t.write(&f, "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL 0\n");
        let fifo = f.join("aer_dev_fatal");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let other = {
            let (fifo, state) = (fifo.clone(), state.clone());
            std::thread::spawn(move || {
                use std::io::Write;
                let mut w = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
                // the other gate read one more correctable error and moved the baseline
                let b1 = PcieBaseline {
                    aer: Some(counts(6, 0, 0)),
                    ..b0
                };
                baseline::write(&state, &b1).unwrap();
                w.write_all(b"TOTAL_ERR_FATAL 1\n").unwrap();
            })
        };
        let seen = FunctionSeen::read(&f, &state, None);
        // Should the read never have opened the FIFO, this open lets the other gate go on,
        // so that the test fails rather than hangs; it is held until the writer is done.
        let _unblock = {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .unwrap()
        };
        other.join().unwrap();
        let v = Verdict::worst(seen.judge());
        assert_eq!(v.status(), "unhealthy", "{v:?} from {seen:?}");
        assert!(
            v.detail()
                .unwrap()
                .contains("1 fatal error on 0000:3b:00.0"),
            "{v:?}"
        );
        advance_baselines(
            &t.0,
            &state,
            &[(
                &gpu_device(),
                Some(&Findings {
                    pcie: Some(vec![seen]),
                    ..Findings::default()
                }),
            )],
            None,
        );
        let kept = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(
            kept.aer.map(|a| a.fatal),
            Some(0),
            "the rise keeps counting"
        );
        fs::remove_dir_all(&t.0).unwrap();
    }

    /// A GPU's DRM node (`/dev/dri/cardN`, which NVIDIA's CDI specs hand out beside
    /// `/dev/nvidiaN`) has the GPU's PCI function; probed first, its reading (which has no
    /// NVML replay count: the node is not the GPU's) must not stand for the GPU's.
    #[test]
    fn a_function_read_first_for_another_device_still_gets_the_gpus_replay_count() {
        let (t, _port, gpu) = gpu_tree("pcie-replay-dri");
        let state = t.0.join("state");
        t.write(&gpu, "aer_dev_fatal", "TOTAL_ERR_FATAL 0\n");
        let d = gpu_device();
        let card = Device {
            num: DevNum {
                typ: DevType::Char,
                major: 226,
                minor: 1,
            },
            class: "dri".into(),
            container_path: Some("/dev/dri/card1".into()),
            ..gpu_device()
        };
        let start = |count: u32| {
            let mut nvml = nvml_with_gpu1_at_3b();
            nvml.gpus.as_mut().unwrap()[1].pcie_replay = Reading::Value(count);
            let g = ctx(nvml, Vec::new());
            let p = PcieProbe::new(&t.0, &state, Some(&g));
            let mut card_found = Findings {
                device_pci: Some(Some(gpu.clone())),
                ..Findings::default()
            };
            let _ = p.check(&card, &mut card_found);
            let mut gpu_found = Findings::default();
            let v = p.check(&d, &mut gpu_found);
            advance_baselines(
                &t.0,
                &state,
                &[(&card, Some(&card_found)), (&d, Some(&gpu_found))],
                Some(&g),
            );
            v
        };
        assert_eq!(start(40), Verdict::Healthy);
        let b = baseline::read(&state, "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(b.replay.map(|r| r.count), Some(40));
        let v = start(43);
        assert_eq!(v.status(), "warn", "{v:?}");
        assert!(
            v.detail().unwrap().contains("3 replays on 0000:3b:00.0"),
            "{v:?}"
        );
        assert_eq!(start(43), Verdict::Healthy, "warned once, then moved past");
        fs::remove_dir_all(&t.0).unwrap();
    }
}
