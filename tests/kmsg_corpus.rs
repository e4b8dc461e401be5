//! The kernel-log parser against real NVIDIA driver lines: tests/fixtures/kmsg/nvrm-lines.txt
//! holds lines gathered from public bug reports, each with its source and the parse it must
//! get (an XID number and PCI address, a driver load, a PCI-to-UUID line, or nothing).
//!
//! The rule checked: a driver line is a kernel-facility record (`pri >> 3 == 0`) whose
//! message begins with `NVRM: `; an XID is such a record that parses in full as
//! `NVRM: Xid (PCI:DOMAIN:BUS:DEV[ GPU-I:n[ GPU-CI:n]]): N, ...` (old drivers: no `PCI:`).
//! Every real line is also replayed the ways an unprivileged user can forge it (a segfault
//! report naming a binary called after it, an OOM kill, a /dev/kmsg write), which must
//! never count.

mod common;
use devgate::gpu::gpu_at::parse_gpu_at;
use devgate::gpu::kmsg::{is_driver_load, parse_record, parse_xid, read_kmsg, ReadLimits};
use devgate::gpu::pci::PciAddr;
use std::fs;
use std::path::PathBuf;

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kmsg/nvrm-lines.txt"
);

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Xid { xid: u32, pci: PciAddr },
    DriverLoad,
    GpuUuid { pci: PciAddr, uuid: String },
    NotXid,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The stanza's first line in the file, for messages.
    at: usize,
    source: String,
    line: String,
    msg: String,
    expect: Expect,
    recovery: Option<String>,
}

fn pci(s: &str, at: usize) -> PciAddr {
    PciAddr::parse_exact(s).unwrap_or_else(|| panic!("corpus line {at}: bad PCI address {s:?}"))
}

fn parse_expect(s: &str, at: usize) -> Expect {
    let f: Vec<&str> = s.split(' ').collect();
    match f.as_slice() {
        ["xid", n, p] => Expect::Xid {
            xid: n
                .parse()
                .unwrap_or_else(|_| panic!("corpus line {at}: bad XID {n:?}")),
            pci: pci(p, at),
        },
        ["driver-load"] => Expect::DriverLoad,
        ["gpu-uuid", p, u] => Expect::GpuUuid {
            pci: pci(p, at),
            uuid: u.to_string(),
        },
        ["not-xid"] => Expect::NotXid,
        _ => panic!("corpus line {at}: unknown expectation {s:?}"),
    }
}

/// Reads the corpus; a malformed stanza fails the test, so the corpus cannot rot quietly.
fn corpus() -> Vec<Entry> {
    let text = fs::read_to_string(CORPUS).unwrap();
    let mut entries = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut start = 0;
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, l) in lines.iter().enumerate() {
        let n = i + 1;
        if l.starts_with('#') {
            continue;
        }
        if l.is_empty() {
            if !fields.is_empty() {
                entries.push(stanza(std::mem::take(&mut fields), start));
            }
            continue;
        }
        if fields.is_empty() {
            start = n;
        }
        // `key: value`, the value taken as is: leading spaces of a line are part of it.
        let (k, v) = l
            .split_once(": ")
            .unwrap_or_else(|| panic!("corpus line {n}: not `key: value`: {l:?}"));
        fields.push((k.to_string(), v.to_string()));
    }
    if !fields.is_empty() {
        entries.push(stanza(fields, start));
    }
    entries
}

fn stanza(fields: Vec<(String, String)>, at: usize) -> Entry {
    let get = |k: &str| {
        let mut v = fields
            .iter()
            .filter(|(fk, _)| fk == k)
            .map(|(_, v)| v.clone());
        let first = v.next();
        assert!(v.next().is_none(), "corpus line {at}: `{k}` twice");
        first
    };
    for (k, _) in &fields {
        assert!(
            ["source", "line", "msg", "expect", "recovery", "note"].contains(&k.as_str()),
            "corpus line {at}: unknown key {k:?}"
        );
    }
    let need = |k: &str| get(k).unwrap_or_else(|| panic!("corpus line {at}: no `{k}`"));
    let e = Entry {
        at,
        source: need("source"),
        line: need("line"),
        msg: need("msg"),
        expect: parse_expect(&need("expect"), at),
        recovery: get("recovery"),
    };
    assert!(
        e.source.starts_with("https://") || e.source.starts_with("gopher://"),
        "corpus line {at}: source is not a URL: {:?}",
        e.source
    );
    assert!(
        e.line.ends_with(&e.msg),
        "corpus line {at}: msg is not the end of line"
    );
    assert!(!e.msg.is_empty() && !e.msg.starts_with(' '));
    e
}

/// A /dev/kmsg record as the kernel writes it.
fn record(pri: u32, seq: u64, msg: &str) -> String {
    format!("{pri},{seq},{},-;{msg}", 1_000_000 + seq * 1000)
}

/// pri 4: kernel facility (0), level warning, as the driver logs XIDs.
const KERN_WARNING: u32 = 4;
/// pri 14: user facility (1 << 3), level info, as a userspace write to /dev/kmsg arrives.
const USER_INFO: u32 = 14;

/// What the parser makes of one entry, as a comparable value.
fn parsed(msg: &str, pri: u32) -> Expect {
    let line = record(pri, 7, msg);
    let rec = parse_record(&line).expect("a well-formed record parses");
    assert_eq!(rec.msg, msg);
    if !rec.is_driver() {
        return Expect::NotXid;
    }
    if let Some((pci, xid, _)) = parse_xid(rec.msg) {
        return Expect::Xid { xid, pci };
    }
    if is_driver_load(rec.msg) {
        return Expect::DriverLoad;
    }
    if let Some((pci, uuid)) = parse_gpu_at(rec.msg) {
        return Expect::GpuUuid { pci, uuid };
    }
    Expect::NotXid
}

#[test]
fn every_real_line_parses_as_its_source_shows() {
    let entries = corpus();
    let mut wrong = Vec::new();
    for e in &entries {
        let got = parsed(&e.msg, KERN_WARNING);
        let want = e.expect.clone();
        if got != want {
            wrong.push(format!(
                "corpus line {} ({}):\n    {}\n    expected {:?}, parsed {:?}",
                e.at, e.source, e.msg, want, got
            ));
        }
        if let (Some(r), Some((_, _, text))) = (&e.recovery, parse_xid(&e.msg)) {
            if !text.contains(r.as_str()) {
                wrong.push(format!(
                    "corpus line {}: XID text {text:?} lost the recovery action {r:?}",
                    e.at
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} real lines parse wrong:\n{}",
        wrong.len(),
        entries.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_corpus_covers_every_shape_it_must() {
    let entries = corpus();
    let has = |what: &str, f: &dyn Fn(&Entry) -> bool| {
        assert!(
            entries.iter().any(f),
            "the corpus has no {what}; add a real one with its source"
        );
    };
    let xid = |e: &Entry| matches!(e.expect, Expect::Xid { .. });
    has("modern XID line", &|e| {
        xid(e) && e.msg.starts_with("NVRM: Xid (PCI:")
    });
    has("legacy XID line (no PCI: prefix)", &|e| {
        xid(e) && e.msg.starts_with("NVRM: Xid (0")
    });
    has(
        "non-zero PCI domain",
        &|e| matches!(e.expect, Expect::Xid { pci, .. } if pci.domain != 0),
    );
    has("MIG GPU-I suffix", &|e| xid(e) && e.msg.contains(" GPU-I:"));
    has("pid='<unknown>'", &|e| {
        xid(e) && e.msg.contains("pid='<unknown>'")
    });
    has("XID 154 with its recovery action", &|e| {
        matches!(e.expect, Expect::Xid { xid: 154, .. }) && e.recovery.is_some()
    });
    has("proprietary driver load", &|e| {
        e.expect == Expect::DriverLoad && e.msg.contains("x86_64 Kernel Module")
    });
    has("Open kernel module load", &|e| {
        e.expect == Expect::DriverLoad && e.msg.contains("Open Kernel Module")
    });
    has("GPU at PCI line", &|e| {
        matches!(e.expect, Expect::GpuUuid { .. })
    });
    has("`caused by previous Xid` line", &|e| {
        xid(e) && e.msg.contains("caused by previous Xid")
    });
    has("NVSwitch SXid line", &|e| {
        e.expect == Expect::NotXid && e.msg.contains(": SXid (")
    });
    has("_kgspLogXid119 line", &|e| {
        e.expect == Expect::NotXid && e.msg.contains("_kgspLogXid119:")
    });
    has("fallen-off notice", &|e| {
        e.expect == Expect::NotXid && e.msg.contains("fallen off the bus")
    });
    assert!(entries.len() >= 60, "{} lines", entries.len());
}

#[test]
fn no_real_line_counts_from_a_user_facility() {
    for e in corpus() {
        let rec_line = record(USER_INFO, 9, &e.msg);
        let rec = parse_record(&rec_line).unwrap();
        assert!(!rec.is_driver(), "corpus line {}: {:?}", e.at, e.msg);
    }
}

/// The forgeries an unprivileged user can make of each real line: the kernel's own segfault
/// report and OOM-kill report name the user's binary, so a binary named after an NVRM line
/// puts that line inside a kernel-facility record, and a write to /dev/kmsg arrives with a
/// user facility. None counts.
#[test]
fn no_real_line_counts_when_forged() {
    for e in corpus() {
        let m = &e.msg;
        let forgeries = [
            (
                6,
                format!(
                    "gpujob[3700]: segfault at 0 ip 000055a5b6e0f139 sp 00007ffd1a3c5e80 error 4 in {m}[1139,55a5b6e0f000+1000] likely on CPU 3 (core 3, socket 0)"
                ),
            ),
            (
                6,
                format!("Code: Unable to access opcode bytes at 0x55a5b6e0f10f. in {m}"),
            ),
            (
                3,
                format!(
                    "Out of memory: Killed process 4242 ({m}) total-vm:1024kB, anon-rss:512kB"
                ),
            ),
            (USER_INFO, m.clone()),
            (12, m.clone()),
        ];
        for (pri, msg) in forgeries {
            assert_eq!(
                parsed(&msg, pri),
                Expect::NotXid,
                "corpus line {}: forged record counted: {pri},…;{msg}",
                e.at
            );
        }
    }
}

fn tempfile(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| common::tempdir("kmsg-corpus"))
        .join(name)
}

/// The whole corpus as one kernel log, through the reader devgate runs: every XID in order,
/// the last driver load found, nothing else.
#[test]
fn the_corpus_as_a_kernel_log_reads_back_every_xid_and_the_last_driver_load() {
    let entries = corpus();
    let log: String = entries
        .iter()
        .enumerate()
        .map(|(i, e)| record(KERN_WARNING, i as u64, &e.msg) + "\n")
        .collect();
    let path = tempfile("kernel.log");
    fs::write(&path, &log).unwrap();
    let scan = read_kmsg(&path, ReadLimits::default()).unwrap();
    assert_eq!(scan.records, entries.len());
    assert_eq!(scan.skipped, 0);
    let want: Vec<(u64, u32, PciAddr)> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.expect {
            Expect::Xid { xid, pci } => Some((i as u64, xid, pci)),
            _ => None,
        })
        .collect();
    let got: Vec<(u64, u32, PciAddr)> = scan.events.iter().map(|x| (x.seq, x.xid, x.pci)).collect();
    assert_eq!(got, want);
    let last_load = entries
        .iter()
        .rposition(|e| e.expect == Expect::DriverLoad)
        .map(|i| i as u64);
    assert_eq!(scan.last_driver_load, last_load);
    // every `GPU at` line maps its UUID to its slot (the corpus's are one per slot)
    for e in &entries {
        if let Expect::GpuUuid { pci, uuid } = &e.expect {
            assert_eq!(scan.pci_of_uuid(uuid), Some(*pci), "corpus line {}", e.at);
        }
    }

    // the same records from a user facility: nothing
    let forged: String = entries
        .iter()
        .enumerate()
        .map(|(i, e)| record(USER_INFO, i as u64, &e.msg) + "\n")
        .collect();
    fs::write(&path, forged).unwrap();
    let scan = read_kmsg(&path, ReadLimits::default()).unwrap();
    assert_eq!(scan.records, entries.len());
    assert!(scan.events.is_empty(), "{:?}", scan.events);
    assert_eq!(scan.last_driver_load, None);
    assert!(scan.gpu_at.is_empty(), "{:?}", scan.gpu_at);
    let _ = fs::remove_file(&path);
}
