//! The XID probe: the NVIDIA driver's error reports in the kernel log.
//!
//! The driver logs `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.`
//! for every error it sees. devgate reads the log once per hook call (`kmsg_path`,
//! non-blocking and bounded), keeps the XID records and the driver's load records, and
//! judges each GPU by the XIDs reported for its PCI address since the driver last loaded.
//!
//! When a report stops counting is decided from the log alone:
//! - the kernel log is per boot (its timestamps count from boot), so a reboot clears
//!   every report;
//! - a driver load (`NVRM: loading NVIDIA UNIX … Kernel Module`) re-initialises every GPU,
//!   so reports logged before the newest load record no longer count;
//! - XID 154 (`GPU recovery action changed from 0x1 (…) to 0x0 (None)`) is the driver
//!   saying the GPU needs nothing more: reports for that GPU logged before it no longer
//!   count. That is what ends an XID after `nvidia-smi -r`, which resets a GPU without
//!   reloading the driver.
//!
//! Each XID is judged by NVIDIA's catalog (`config::xid`); XID 154 by the recovery action
//! its line names (`model::recovery`), which needs no NVML call (NVML can hang).

use super::kmsg::XidEvent;
use super::pci::PciAddr;
use crate::config::xid::{catalog_entry, describe_xid, XidAction, XidTable};
use crate::model::recovery::{RecoveryAction, RecoveryEffect};
use crate::model::verdict::{Code, Verdict};
use std::collections::BTreeMap;

/// The XID whose line carries the driver's recovery action.
pub const XID_RECOVERY_ACTION: u32 = 154;

/// `0x1f` → 31. At most 8 hex digits: the driver prints a 32-bit value.
fn hex_token(s: &str) -> Option<(u32, &str)> {
    let s = s.strip_prefix("0x")?;
    let n = s.bytes().take_while(u8::is_ascii_hexdigit).count();
    if n == 0 || n > 8 {
        return None;
    }
    Some((u32::from_str_radix(&s[..n], 16).ok()?, &s[n..]))
}

/// XID 154's text: `GPU recovery action changed from 0xA (name) to 0xB (name)` → (A, B).
/// The names differ between driver branches (`Node Reboot Required`, `OS Reboot`,
/// `PF FLR`); the numbers are NVML's `nvmlGpuRecoveryAction_t` and are what is read.
pub fn parse_recovery_change(text: &str) -> Option<(RecoveryAction, RecoveryAction)> {
    let rest = text.strip_prefix("GPU recovery action changed from ")?;
    let (from, rest) = hex_token(rest)?;
    let (_, rest) = rest.split_once(" to ")?;
    let (to, _) = hex_token(rest)?;
    Some((
        RecoveryAction::from_code(from),
        RecoveryAction::from_code(to),
    ))
}

/// The recovery action an XID 154 event moves to, unless the operator overrode XID 154
/// (then it is an XID like any other).
fn recovery_of(e: &XidEvent, table: &XidTable) -> Option<RecoveryAction> {
    if e.xid != XID_RECOVERY_ACTION || table.is_overridden(e.xid) {
        return None;
    }
    parse_recovery_change(&e.text).map(|(_, to)| to)
}

/// Whether one report, on its own, blocks its GPU: what poststop calls a critical fault.
pub fn blocks(e: &XidEvent, table: &XidTable) -> bool {
    match recovery_of(e, table) {
        Some(a) => a.effect() == RecoveryEffect::Blocks,
        None => table.action(e.xid) == XidAction::Unhealthy,
    }
}

fn at(e: &XidEvent) -> String {
    format!(
        "{}.{:06} s after boot (kmsg seq {})",
        e.ts_usec / 1_000_000,
        e.ts_usec % 1_000_000,
        e.seq
    )
}

/// Judges one GPU by the reports that still count for its slot. Pure.
///
/// Long because it is one pass in log order (XID 154's "to None" ends what came before
/// it, so order matters) followed by one reason per XID; splitting it would split that
/// order across functions.
pub fn judge_reports<'a>(
    events: impl Iterator<Item = &'a XidEvent>,
    pci: &PciAddr,
    table: &XidTable,
) -> Verdict {
    // xid → (count, newest report)
    let mut seen: BTreeMap<u32, (usize, &XidEvent)> = BTreeMap::new();
    // the newest XID 154 that still asks for something
    let mut recovery: Option<(RecoveryAction, &XidEvent)> = None;
    for e in events.filter(|e| e.pci.same_slot(pci)) {
        if let Some(to) = recovery_of(e, table) {
            if to.effect() == RecoveryEffect::Clears {
                // The driver says the GPU needs nothing more: what came before is over.
                seen.clear();
                recovery = None;
            } else {
                recovery = Some((to, e));
            }
            continue;
        }
        if table.action(e.xid) == XidAction::Ignore {
            continue;
        }
        let entry = seen.entry(e.xid).or_insert((0, e));
        entry.0 += 1;
        entry.1 = e;
    }
    let mut findings = Vec::new();
    if let Some((to, e)) = recovery {
        let reason = format!(
            "xid 154 on {}: the driver's recovery action is {}, at {}: {:?}",
            e.pci,
            to.describe(),
            at(e),
            e.text
        );
        findings.push(match to.effect() {
            RecoveryEffect::Blocks => Verdict::unhealthy(to.reason_code(), reason),
            _ => Verdict::warn(to.reason_code(), reason),
        });
    }
    for (xid, (count, last)) in &seen {
        let what = describe_xid(*xid)
            .map(|d| format!("xid {xid} ({d})"))
            .unwrap_or_else(|| format!("xid {xid} (not in NVIDIA's XID catalog devgate carries)"));
        let reason = format!(
            "{what} on {} reported {count} time{} since the driver loaded, last at {}: {:?}",
            last.pci,
            if *count == 1 { "" } else { "s" },
            at(last),
            last.text
        );
        let advice = match catalog_entry(*xid) {
            Some(c) if !table.is_overridden(*xid) => c.resolution.advice(),
            _ => "GPU reset or reboot required",
        };
        findings.push(match table.action(*xid) {
            XidAction::Unhealthy => {
                Verdict::unhealthy(Code::XidCritical, format!("{reason}; {advice}"))
            }
            _ if describe_xid(*xid).is_none() => Verdict::warn(Code::XidUnknown, reason),
            _ => Verdict::warn(Code::XidWarning, reason),
        });
    }
    match Verdict::worst(findings) {
        v @ (Verdict::Unhealthy(_) | Verdict::Warn(_)) => v.prefixed("xid: "),
        _ => Verdict::Healthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kmsg::tests::{scan_bytes, FIXTURE};
    use crate::gpu::kmsg::ReadLimits;

    fn ev(seq: u64, slot: &str, xid: u32, text: &str) -> XidEvent {
        XidEvent {
            seq,
            ts_usec: seq * 1000,
            pci: PciAddr::parse_exact(slot).unwrap(),
            xid,
            text: text.into(),
        }
    }

    #[test]
    fn xid_154_lines_name_the_action_by_number_whatever_the_words() {
        use RecoveryAction::*;
        let p = parse_recovery_change;
        // the forms real drivers print (tests/fixtures/kmsg/README.md)
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
            Some((None, GpuReset))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
            Some((None, NodeReboot))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"),
            Some((None, NodeReboot))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"),
            Some((None, GpuReset))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"),
            Some((GpuReset, None))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)"),
            Some((None, DrainP2p))
        );
        assert_eq!(
            p("GPU recovery action changed from 0x0 (None) to 0x1f (Something New)"),
            Some((None, Other(31)))
        );
        // near misses read as nothing: the catalog then judges XID 154 (a warning)
        for bad in [
            "GPU recovery action changed",
            "GPU recovery action changed from 0x0 (None) to (GPU Reset Required)",
            "GPU recovery action changed from 0x (None) to 0x1 (x)",
            "GPU recovery action changed from 0x0 (None) to 0x1234567890 (x)",
            "gpu recovery action changed from 0x0 (None) to 0x1 (x)",
            "",
        ] {
            assert_eq!(p(bad), Option::None, "{bad:?}");
        }
    }

    /// Long because it walks every recovery action XID 154 reports and the line that clears
    /// them, case after case, on one table and one GPU.
    #[test]
    fn xid_154_blocks_warns_or_ends_earlier_reports() {
        let t = XidTable::default();
        let gpu = PciAddr::parse_exact("0000:01:00").unwrap();
        let to = |n: u32, name: &str| {
            format!("GPU recovery action changed from 0x0 (None) to {n:#x} ({name})")
        };
        // reset required: unhealthy on the line alone, no NVML needed
        let evs = [ev(1, "0000:01:00", 154, &to(1, "GPU Reset Required"))];
        let v = judge_reports(evs.iter(), &gpu, &t);
        assert_eq!(
            v,
            Verdict::unhealthy(
                Code::RecoveryGpuReset,
                "xid: xid 154 on 0000:01:00: the driver's recovery action is GPU reset required, at 0.001000 s after boot (kmsg seq 1): \"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\""
            )
        );
        assert!(blocks(&evs[0], &t));
        // node reboot: unhealthy; drain and reset: unhealthy
        for (n, name, code) in [
            (2, "Node Reboot Required", Code::RecoveryNodeReboot),
            (4, "Drain and Reset", Code::RecoveryDrainAndReset),
        ] {
            let evs = [ev(1, "0000:01:00", 154, &to(n, name))];
            let v = judge_reports(evs.iter(), &gpu, &t);
            assert_eq!((v.status(), v.code()), ("unhealthy", Some(code)));
        }
        // drain P2P: a warning, not "reject every container"
        let evs = [ev(1, "0000:01:00", 154, &to(3, "Drain P2P"))];
        let v = judge_reports(evs.iter(), &gpu, &t);
        assert_eq!(v.status(), "warn", "{v:?}");
        assert_eq!(v.code(), Some(Code::RecoveryDrainP2p));
        assert!(!blocks(&evs[0], &t));
        // an action newer than devgate asks for work before new use, as NVML's does
        let evs = [ev(1, "0000:01:00", 154, &to(9, "New"))];
        let v = judge_reports(evs.iter(), &gpu, &t);
        assert!(
            v.detail()
                .unwrap()
                .contains("recovery action 0x9 (unknown to devgate)"),
            "{v:?}"
        );
        assert_eq!(v.status(), "unhealthy");
        assert_eq!(v.code(), Some(Code::RecoveryOther));
        // another GPU's line says nothing about this one
        let evs = [ev(1, "0000:02:00", 154, &to(1, "GPU Reset Required"))];
        assert_eq!(judge_reports(evs.iter(), &gpu, &t), Verdict::Healthy);
        // XID 79 then a reset (nvidia-smi -r): the driver's "to 0x0 (None)" ends it
        let evs = [
            ev(1, "0000:01:00", 79, "GPU has fallen off the bus."),
            ev(2, "0000:01:00", 154, &to(2, "Node Reboot Required")),
            ev(
                3,
                "0000:01:00",
                154,
                "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
            ),
        ];
        assert_eq!(judge_reports(evs.iter(), &gpu, &t), Verdict::Healthy);
        // ...but only what came before it: a later XID counts again
        let later = [
            ev(1, "0000:01:00", 79, "GPU has fallen off the bus."),
            ev(
                3,
                "0000:01:00",
                154,
                "GPU recovery action changed from 0x1 (x) to 0x0 (None)",
            ),
            ev(4, "0000:01:00", 95, "Uncontained"),
        ];
        let v = judge_reports(later.iter(), &gpu, &t);
        assert!(v.detail().unwrap().contains("xid 95"), "{v:?}");
        assert!(!v.detail().unwrap().contains("xid 79"), "{v:?}");
        // the clearing line for another GPU clears nothing here
        let other = [
            ev(1, "0000:01:00", 79, "GPU has fallen off the bus."),
            ev(
                2,
                "0000:02:00",
                154,
                "GPU recovery action changed from 0x1 (x) to 0x0 (None)",
            ),
        ];
        assert_eq!(judge_reports(other.iter(), &gpu, &t).status(), "unhealthy");
        // a 154 line without numbers: the catalog's word for 154, a warning
        let vague = [ev(1, "0000:01:00", 154, "GPU recovery action changed")];
        let v = judge_reports(vague.iter(), &gpu, &t);
        assert_eq!((v.status(), v.code()), ("warn", Some(Code::XidWarning)));
    }

    #[test]
    fn an_unknown_xid_warns_and_says_so() {
        let t = XidTable::default();
        let gpu = PciAddr::parse_exact("0000:01:00").unwrap();
        let evs = [ev(1, "0000:01:00", 4242, "brand new")];
        let v = judge_reports(evs.iter(), &gpu, &t);
        assert_eq!(v.status(), "warn");
        assert_eq!(v.code(), Some(Code::XidUnknown));
        assert!(
            v.detail()
                .unwrap()
                .contains("xid 4242 (not in NVIDIA's XID catalog devgate carries)"),
            "{v:?}"
        );
    }

    #[test]
    fn reports_before_the_newest_driver_load_do_not_count() {
        let log = "\
4,10,1000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n\
4,11,2000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n\
4,12,3000,-;NVRM: Xid (PCI:0000:5e:00): 48, DBE\n";
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        let active: Vec<u32> = s.active().map(|e| e.xid).collect();
        assert_eq!(active, vec![48]);
        let t = XidTable::default();
        let gpu3b = PciAddr::parse("00000000:3B:00.0").unwrap();
        assert_eq!(judge_reports(s.active(), &gpu3b, &t), Verdict::Healthy);
        // without the load record the same report still counts
        let s = scan_bytes(
            log.lines().next().unwrap().as_bytes(),
            ReadLimits::default(),
        );
        let v = judge_reports(s.active(), &gpu3b, &t);
        assert_eq!(
            (v.status(), v.code()),
            ("unhealthy", Some(Code::XidCritical))
        );
    }

    #[test]
    fn classification_and_reason_carry_the_figures() {
        let s = scan_bytes(FIXTURE.as_bytes(), ReadLimits::default());
        let t = XidTable::default();
        let v = judge_reports(s.active(), &PciAddr::parse("00000000:3B:00.0").unwrap(), &t);
        assert_eq!(
            v,
            Verdict::unhealthy(
                Code::XidCritical,
                "xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 2 times since the driver loaded, last at 12.345678 s after boot (kmsg seq 300): \"pid=1234, name=python3, GPU has fallen off the bus.\"; node reboot required"
            )
        );
        // application XID 31 alone: ignored
        let v = judge_reports(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(v, Verdict::Healthy);
        // unknown XID 154: a warning
        let v = judge_reports(s.active(), &PciAddr::parse("0000:af:00.0").unwrap(), &t);
        assert_eq!(v.status(), "warn", "{v:?}");
        // old-format address, DBE
        let v = judge_reports(s.active(), &PciAddr::parse("0000:86:00.0").unwrap(), &t);
        assert!(
            v.detail()
                .unwrap()
                .contains("xid 48 (Double Bit ECC Error)"),
            "{v:?}"
        );
        // the operator's table wins
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "warn".to_string());
        o.insert("31".to_string(), "unhealthy".to_string());
        let t = XidTable::new(&o).unwrap();
        let v = judge_reports(s.active(), &PciAddr::parse("0000:3b:00.0").unwrap(), &t);
        assert_eq!((v.status(), v.code()), ("warn", Some(Code::XidWarning)));
        let v = judge_reports(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(
            (v.status(), v.code()),
            ("unhealthy", Some(Code::XidCritical))
        );
    }
}
