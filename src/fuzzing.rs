//! Entry points for the fuzz targets under fuzz/ (`make fuzz`; docs/development.md).
//! Each takes raw bytes as they would arrive from outside, runs the parser devgate runs
//! on them, and asserts what must hold of whatever it returns (a round trip, a bound), so
//! a fuzzer finds a broken invariant as a crash. Not an API: hidden from the docs, and
//! it re-exports nothing, so the parsers keep their crate-private visibility.

use crate::cli::doctor::{kubelet, kubelet_config};
use crate::config::Config;
use crate::gpu::gpu_at;
use crate::gpu::kmsg::{self, ReadLimits};
use crate::gpu::pci::PciAddr;
use crate::gpu::request::{gpu_selectors, GpuSelector};
use crate::gpu::xid_history;
use crate::model::class;
use crate::oci::spec::Spec;
use crate::oci::state::State;
use crate::report::record::{Decision, ExitRecord};
use crate::store::lease::Lease;
use crate::store::quarantine::Entry;
use crate::store::{file_name, num_from_file_name};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

mod cli_model;
mod cluster;
pub use cluster::cluster_taints;
mod glibc;
mod rule_model;
mod toolkit_model;
mod toolkit_sources;

/// Where no fuzz input can point: discovery looks under these and finds nothing.
const NOWHERE: &str = "/nonexistent/devgate-fuzz";

/// The container state a runtime passes on stdin.
pub fn oci_state(data: &[u8]) {
    if let Ok(s) = State::parse(data) {
        assert!(!s.id.is_empty());
        assert!(s.bundle.is_absolute());
    }
}

mod go_keys;

/// A bundle's config.json, then everything devgate reads out of it: devices, bind
/// mounts, cgroup rules, NVIDIA_VISIBLE_DEVICES and CDI annotations. Differentially, its
/// keys: devgate accepts no spec that Go's encoding/json (runc, the NVIDIA toolkit) would
/// read otherwise, and refuses one for a key only where the reference model finds a cause.
pub fn oci_spec(data: &[u8]) {
    let parsed = Spec::parse(data, Path::new("config.json"));
    if let Ok(doc) = serde_json::from_slice::<go_keys::Doc>(data) {
        let apart = go_keys::read_apart(&doc);
        match &parsed {
            Ok(_) => assert!(!apart, "accepted a spec Go reads otherwise"),
            Err(e @ crate::error::Error::Invalid { .. }) => {
                assert!(apart, "refused for a key the model finds nothing in: {e}")
            }
            Err(_) => {}
        }
    }
    let Ok(spec) = parsed else {
        return;
    };
    let selectors = gpu_selectors(&spec);
    assert!(selectors.len() <= crate::gpu::request::MAX_SELECTORS + 1);
    let may = crate::discover::may_name_devices(&spec);
    let nowhere = Path::new(NOWHERE);
    if let Ok(devices) = crate::discover::discover(&spec, &class::builtin(), nowhere, nowhere) {
        // What discovery finds, the cheap pre-check must have said might be there.
        assert!(
            devices.is_empty() || may,
            "discover found devices may_name_devices missed"
        );
        // An NVIDIA device or a GPU selector the hook front's test missed would be gated
        // in a process that cannot load NVML (slower, through the query process).
        if devices.iter().any(|d| d.class.is_nvidia()) {
            assert!(
                crate::discover::may_name_nvidia_nodes(&spec),
                "discover found an NVIDIA device may_name_nvidia_nodes missed"
            );
        }
        if !selectors.is_empty() {
            assert!(
                crate::gpu::may_have_devices(&spec) && crate::gpu::may_name_nvidia(&spec),
                "a GPU selector the gpu pre-checks missed"
            );
        }
    }
}

/// devgate's own config file.
pub fn config(data: &[u8]) {
    let _ = Config::parse(data, Path::new("config.json"));
}

/// A KubeletConfiguration file as `devgate doctor` reads it for `podLogsDir`, and a
/// kubelet command line (NUL-separated, as /proc/PID/cmdline holds it) for its flags. A
/// value read holds no line break: the YAML reader never joins lines kubelet would part.
pub fn kubelet_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(Some(dir)) = kubelet_config::parse_config(text) {
            assert!(
                !dir.contains(['\n', '\r']),
                "a podLogsDir across lines: {dir:?}"
            );
        }
    }
    let args: Vec<String> = data
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let _ = kubelet::parse_flags(&args);
}

/// Reads `data` as a ledger or record file, and checks that what devgate would write
/// back reads the same.
fn round_trip<T: DeserializeOwned + Serialize>(data: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(data).ok()?;
    let once = serde_json::to_vec_pretty(&v).expect("devgate's own types serialize");
    let back: T = serde_json::from_slice(&once).expect("what devgate writes, it reads");
    let twice = serde_json::to_vec_pretty(&back).unwrap();
    assert_eq!(once, twice, "a record changes when written back");
    Some(back)
}

/// A quarantine ledger entry, and the ledger's file names.
pub fn quarantine_entry(data: &[u8]) {
    if let Some(e) = round_trip::<Entry>(data) {
        assert_eq!(num_from_file_name(&file_name(e.num)), Some(e.num));
    }
    if let Ok(name) = std::str::from_utf8(data) {
        if let Some(num) = num_from_file_name(name) {
            assert_eq!(num_from_file_name(&file_name(num)), Some(num));
        }
    }
}

/// A spare lease.
pub fn lease(data: &[u8]) {
    if let Some(l) = round_trip::<Lease>(data) {
        let again: Lease = serde_json::from_slice(&serde_json::to_vec(&l).unwrap()).unwrap();
        assert_eq!(l, again);
    }
}

/// A container's start record, or its exit record.
pub fn records(data: &[u8]) {
    let _ = round_trip::<Decision>(data);
    let _ = round_trip::<ExitRecord>(data);
}

/// One kernel log line: the record, and when it is the driver's, the driver-load and XID
/// parsers. A parsed XID's PCI address prints as an address that parses back to itself.
pub fn kmsg_record(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    let Some(rec) = kmsg::parse_record(&line) else {
        return;
    };
    let _ = kmsg::is_driver_load(rec.msg);
    if let Some((pci, xid, text)) = kmsg::parse_xid(rec.msg) {
        assert!(xid < 1_000_000);
        assert!(text.chars().count() <= 160);
        let printed = pci.to_string();
        assert_eq!(PciAddr::parse_exact(&printed), Some(pci), "{printed}");
        // XID 154's recovery action, read from the same text
        if let Some((from, to)) = crate::gpu::xid::parse_recovery_change(&text) {
            assert!(text.starts_with("GPU recovery action changed from 0x"));
            let _ = (from.describe(), to.effect());
        }
    }
}

/// A driver `GPU at` message: when it parses, the UUID has the checked form, and the line
/// printed back from the result parses to the same address and UUID.
pub fn gpu_at(data: &[u8]) {
    let msg = String::from_utf8_lossy(data);
    if let Some((pci, uuid)) = gpu_at::parse_gpu_at(&msg) {
        assert!(gpu_at::is_gpu_uuid(&uuid));
        assert_eq!(uuid.len(), 40);
        assert!(pci.function.is_none());
        let again = format!("NVRM: GPU at PCI:{pci}: {uuid}");
        assert_eq!(gpu_at::parse_gpu_at(&again), Some((pci, uuid)));
    }
}

/// The XID history file (state_dir/xid-history.json): whatever parses holds no more
/// than a scan could have written, and writes back to what parses to itself.
pub fn xid_history(data: &[u8]) {
    let limits = ReadLimits::default();
    let Ok(c) = xid_history::parse(data, limits) else {
        return;
    };
    assert!(c.events.len() <= limits.max_events);
    assert!(c.gpu_at.len() <= gpu_at::MAX_GPU_AT);
    assert!(c.events.iter().all(|e| e.seq <= c.last_seq));
    assert!(c.gpu_at.iter().all(|g| g.seq <= c.last_seq));
    let bytes = serde_json::to_vec(&c).expect("a parsed cache serializes");
    assert_eq!(xid_history::parse(&bytes, limits).ok(), Some(c));
}

/// A stream of kernel log bytes through the same scanner read_kmsg uses, in reads of a
/// size the input chooses, with small limits so they are reached.
pub fn kmsg_scan(data: &[u8]) {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let limits = ReadLimits {
        max_bytes: 1 << 16,
        max_records: 64,
        max_line: 512,
        max_events: 8,
        deadline: std::time::Duration::from_secs(5),
    };
    let scan = kmsg::scan_chunks(rest.chunks(usize::from(chunk).max(1)), limits);
    assert!(scan.events.len() <= limits.max_events);
    assert!(scan.records <= limits.max_records);
    for e in &scan.events {
        assert!(e.text.chars().count() <= 160);
        assert_eq!(PciAddr::parse_exact(&e.pci.to_string()), Some(e.pci));
    }
}

/// /proc/PID/cgroup.
pub fn proc_cgroup(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for c in crate::action::cgroup::parse_proc_cgroup(&text) {
        assert!(!c.path.contains('\n'));
        assert!(c
            .controllers
            .iter()
            .all(|x| !x.is_empty() && !x.contains(',')));
    }
}

/// /proc/PID/stat, whose command name a process chooses: the start time found is one of
/// the kernel's numbers after the name.
pub fn proc_stat(data: &[u8]) {
    if let Some(t) = crate::store::lease::start_time(data) {
        let close = data
            .iter()
            .rposition(|&b| b == b')')
            .expect("found after a ')'");
        let rest = String::from_utf8_lossy(&data[close + 1..]);
        assert!(rest.split_ascii_whitespace().any(|w| w.parse() == Ok(t)));
    }
}

/// /proc/self/mountinfo.
pub fn mountinfo(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for m in crate::action::cgroup::parse_mountinfo(&text) {
        assert!(!m.fstype.contains(' '));
        assert!(!m.super_options.is_empty());
    }
}

/// A value of NVIDIA_VISIBLE_DEVICES, read by devgate and by a reference model of the
/// NVIDIA toolkit's rules (`toolkit_model`): both must name the same GPUs.
pub fn toolkit_selectors(data: &[u8]) {
    if let Ok(value) = std::str::from_utf8(data) {
        toolkit_model::check(value);
    }
}

/// A spec with CDI annotations, device-plugin volume mounts and NVIDIA_VISIBLE_DEVICES,
/// read by devgate and by the reference model of the toolkit's rules
/// (`toolkit_sources::check_sources`). The input is NUL-separated entries, each a tag byte and
/// its text: `a` a `cdi.k8s.io/` annotation's value, `o` another key's annotation, `m` a
/// mount of `/dev/null` at the text, `n` one at the plugin's root joined with the text,
/// `s` a mount `source<TAB>destination`, `e` the variable (the first one), `c` a legacy
/// CUDA image (`CUDA_VERSION`), `A` a node whose toolkit reads the mounts
/// (`accept-nvidia-visible-devices-as-volume-mounts`).
pub fn toolkit_sources(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        toolkit_sources::check_sources(&toolkit_sources::Sources::from_entries(text));
    }
}

/// One `linux.resources.devices` allow rule after a deny-all, read by each runtime's
/// reference model (`rule_model`: crun's C `int`s, eBPF and systemd; runc; youki; cgroup
/// v1) and by devgate (`model::rule_number`): every device a runtime grants through it,
/// devgate's reading covers, or devgate refuses the rule. The input: `rule_model::rule_from`.
pub fn rule_numbers(data: &[u8]) {
    rule_model::check(&rule_model::rule_from(data));
}

/// A GPU list and device tokens, read by nvidia-container-cli's `select_devices` (the
/// reference model `cli_model`, glibc's own number reading) and by devgate: every GPU the
/// cli hands over for a token, devgate checks. The input: a GPU count byte, four bytes per
/// GPU (`cli_model::gpus_from`), then comma-separated tokens.
pub fn cli_selection(data: &[u8]) {
    let (gpus, rest) = cli_model::gpus_from(data);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    for token in text.split(',').take(64) {
        cli_model::check(token, &gpus);
    }
}

/// A value of NVIDIA_VISIBLE_DEVICES and of a CDI annotation, as a container sets them.
pub fn gpu_selector_values(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let spec = Spec {
        annotations: BTreeMap::from([("cdi.k8s.io/fuzz".to_string(), value.to_string())]),
        process: serde_json::from_value(serde_json::json!({
            "env": [format!("NVIDIA_VISIBLE_DEVICES={value}")]
        }))
        .ok(),
        ..Spec::default()
    };
    for token in value.split(',').take(64) {
        glibc::selector_agrees_with_glibc(token);
    }
    let selectors = gpu_selectors(&spec);
    assert!(selectors.len() <= crate::gpu::request::MAX_SELECTORS + 1);
    for (s, _) in selectors {
        match s {
            GpuSelector::All
            | GpuSelector::Index(_)
            | GpuSelector::Mig { .. }
            | GpuSelector::Unread => {}
            // a bus id printed as NVIDIA prints it reads back as itself
            GpuSelector::PciBusId {
                domain,
                bus,
                device,
                ..
            } => {
                let printed = format!("{domain:08x}:{bus:02x}:{device:02x}.0");
                match crate::gpu::selector::parse(&printed) {
                    Some(GpuSelector::PciBusId {
                        domain: d,
                        bus: b,
                        device: v,
                        ..
                    }) => assert_eq!((d, b, v), (domain, bus, device)),
                    other => panic!("{printed:?}: {other:?}"),
                }
            }
            GpuSelector::Uuid(u) => {
                assert!(u.len() <= 96 && u.as_bytes()[..4].eq_ignore_ascii_case(b"GPU-"));
            }
            GpuSelector::MigUuid(u) => {
                assert!(u.len() <= 96 && u.as_bytes()[..4].eq_ignore_ascii_case(b"MIG-"));
            }
            // the reason quotes at most a bounded piece of the token, escaped
            GpuSelector::Invalid(why) => assert!(why.len() <= 1024, "{why}"),
        }
    }
}

/// What an NVML query process writes on its pipe: refused with a reason, or read into an
/// answer that writes back out the same.
pub fn nvml_answer(data: &[u8]) {
    use crate::gpu::nvml::isolate::{decode, Answer};
    if let Ok(a) = decode(data) {
        if let Answer::Gpus { gpus, .. } = &a {
            assert!(gpus.len() <= 256);
        }
        let again = serde_json::to_vec(&a).expect("an answer serialises");
        assert_eq!(decode(&again).expect("re-encoded answer decodes"), a);
    }
}

/// A sysfs AER counter file (`aer_dev_correctable`, `…_nonfatal`, `…_fatal`), then the
/// baseline rule over what it parsed to.
pub fn aer_counters(data: &[u8]) {
    use crate::probe::pcie::{advance, judge_aer, judge_replay, parse_aer};
    use crate::store::pcie::{AerCounts, PcieBaseline, ReplayCount};
    // as read_attr hands it over: at most 4096 bytes, lossy UTF-8, trimmed
    let text = String::from_utf8_lossy(&data[..data.len().min(4096)]);
    let text = text.trim();
    let mut parsed = Vec::new();
    for key in ["TOTAL_ERR_COR", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_FATAL"] {
        match parse_aer(text, key) {
            Ok(n) => parsed.push(n),
            // two quoted pieces of at most 64 characters, each escaped to at most 10 bytes
            Err(e) => assert!(e.to_string().len() <= 2048, "{e}"),
        }
    }
    for (i, &n) in parsed.iter().enumerate() {
        let now = AerCounts {
            correctable: n,
            nonfatal: n / 2,
            fatal: n / (i as u64 + 1),
        };
        let aer = AerCounts {
            correctable: n / 3,
            nonfatal: n,
            fatal: n / 2,
        };
        let base = PcieBaseline {
            function: "0000:3b:00.0".into(),
            time_unix: n,
            aer: Some(aer),
            replay: Some(ReplayCount {
                count: n / 2,
                time_unix: n,
            }),
        };
        let _ = judge_aer("0000:3b:00.0", &now, Some(&base));
        let _ = judge_replay("0000:3b:00.0", n, Some(&base));
        let next = advance(&now, Some(&aer));
        assert!(next.correctable <= now.correctable && next.fatal <= now.fatal.max(aer.fatal));
    }
}

#[cfg(test)]
mod tests {
    type Target = fn(&[u8]);

    /// Every checked-in seed runs through its target without tripping an assertion: the
    /// seeds are real inputs, so a change that breaks one shows here, without cargo-fuzz.
    #[test]
    fn every_seed_runs_through_its_target() {
        let targets: [(&str, Target); 20] = [
            ("oci_state", super::oci_state),
            ("oci_spec", super::oci_spec),
            ("config", super::config),
            ("quarantine_entry", super::quarantine_entry),
            ("lease", super::lease),
            ("records", super::records),
            ("kmsg_record", super::kmsg_record),
            ("kmsg_scan", super::kmsg_scan),
            ("proc_cgroup", super::proc_cgroup),
            ("mountinfo", super::mountinfo),
            ("gpu_selector_values", super::gpu_selector_values),
            ("toolkit_selectors", super::toolkit_selectors),
            ("toolkit_sources", super::toolkit_sources),
            ("cli_selection", super::cli_selection),
            ("rule_numbers", super::rule_numbers),
            ("gpu_at", super::gpu_at),
            ("xid_history", super::xid_history),
            ("nvml_answer", super::nvml_answer),
            ("aer_counters", super::aer_counters),
            ("cluster_taints", super::cluster_taints),
        ];
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        for (name, run) in targets {
            let dir = seeds.join(name);
            for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let p = e.unwrap().path();
                run(&std::fs::read(&p).unwrap());
            }
        }
    }

    /// Every key of every config.json seed with its first letter's case flipped, one at a
    /// time: Go folds each to the key, so devgate and the reference model must agree on
    /// each (the fuzzer found `linux.nameSpaces`, read by devgate and missing from the
    /// model, only by chance). String values are flipped too; the target's invariants hold
    /// for those as well.
    #[test]
    fn every_spec_seed_key_flipped_agrees_with_the_model() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/oci_spec");
        let mut flipped = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            for i in 0..data.len().saturating_sub(1) {
                if data[i] == b'"' && data[i + 1].is_ascii_alphabetic() {
                    let mut v = data.clone();
                    v[i + 1] ^= 0x20;
                    super::oci_spec(&v);
                    flipped += 1;
                }
            }
        }
        assert!(flipped > 100, "only {flipped} keys flipped: seeds missing?");
    }

    /// The record seeds are records as devgate writes them (devices with every verdict
    /// status, a rule-only device, a snapshot with GPU counters): each reads back, so a
    /// change to how records are read (the wire structs that replaced serde's flatten)
    /// that drops one written by an earlier devgate shows here.
    #[test]
    fn every_record_seed_reads_as_a_record() {
        use crate::report::record::{Decision, ExitRecord};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/records");
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let data = std::fs::read(&p).unwrap();
            let d = super::round_trip::<Decision>(&data).map(|d| d.devices.len());
            let x = super::round_trip::<ExitRecord>(&data).map(|x| x.devices.len());
            assert!(
                d.is_some() || x.is_some(),
                "{} reads as no record",
                p.display()
            );
        }
    }
}
