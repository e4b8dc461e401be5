//! A reference model of nvidia-container-cli's `select_devices` (libnvidia-container,
//! `src/cli/common.c`), written apart from `gpu::selector` and `gpu::select`: the order in
//! which it reads one device token and where each reading falls through to the next.
//! Numbers are read by glibc itself (`sscanf`, `strtoumax`), never by a Rust copy.
//!
//! Per token, after `strsep` on commas (empty tokens skipped):
//! 1. `all` (`strcasecmp`): every GPU and MIG device; the list ends.
//! 2. `select_gpu_device`: a `GPU-` token longer than `GPU-` equal to a GPU's UUID in any
//!    case; else `sscanf("%x:%02x:%02x.0") == 3` printed back as `%08x:%02x:%02x.0` and
//!    compared (`strncasecmp` over its length) with each GPU's bus id; else
//!    `strtoumax(token, &end, 10)` to the end, below `UINTMAX_MAX` and the GPU count.
//! 3. `select_mig_device`: a `MIG-` token equal to a MIG device's UUID; else
//!    `sscanf("%lu:%lu") == 2` with the GPU index and MIG index in range, handed over with
//!    its parent GPU.
//! 4. Nothing: `unknown device`, the whole selection fails (the start with it).
//!
//! The differential check ([`check`]): every GPU the cli hands over for a token, devgate
//! checks for the same token against the same GPU list. A MIG UUID is the one exception
//! devgate names: it lists no MIG devices, so it cannot place one (a warning, an unknown
//! to the policy).

use crate::gpu::pci::PciAddr;
use crate::gpu::select::{resolve_selectors, GpuId, KnownGpus};
use crate::gpu::selector::{parse, GpuSelector};
use crate::model::device::Source;
use std::collections::BTreeSet;
use std::ffi::{CStr, CString};

/// One GPU as the cli sees it: NVML's UUID and bus id (`%08X:%02X:%02X.0`), its MIG
/// devices' UUIDs.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub uuid: String,
    pub busid: String,
    pub migs: Vec<String>,
}

/// What the cli hands over for a token list: GPU indexes (MIG devices by their parent),
/// or a refusal (`unknown device`).
#[derive(Debug, PartialEq, Eq)]
pub enum Cli {
    Selected(BTreeSet<usize>),
    Refused,
}

fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.as_bytes().eq_ignore_ascii_case(b.as_bytes())
}

/// `matches_pci_format`: glibc's three conversions into `int`s, printed back with `%x`
/// (an `int` printed as unsigned: -1 is `ffffffff`).
fn pci_format(c: &CStr) -> Option<String> {
    let (mut d, mut b, mut v): (libc::c_int, libc::c_int, libc::c_int) = (0, 0, 0);
    // SAFETY: a NUL-terminated string, a NUL-terminated format and three c_int
    // out-pointers for its three %x conversions.
    let n = unsafe {
        libc::sscanf(
            c.as_ptr(),
            c"%x:%02x:%02x.0".as_ptr(),
            &mut d as *mut libc::c_int,
            &mut b as *mut libc::c_int,
            &mut v as *mut libc::c_int,
        )
    };
    (n == 3).then(|| format!("{:08x}:{:02x}:{:02x}.0", d as u32, b as u32, v as u32))
}

/// `strtoumax(token, &end, 10)` read to the end and below `UINTMAX_MAX`.
fn index(c: &CStr) -> Option<u64> {
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a local end pointer.
    let n = unsafe { libc::strtoull(c.as_ptr(), &mut end, 10) };
    // SAFETY: strtoull leaves `end` inside the string it read.
    let whole = unsafe { *end } == 0;
    (whole && n < u64::MAX).then_some(n)
}

/// `sscanf(token, "%lu:%lu") == 2`.
fn mig_index(c: &CStr) -> Option<(u64, u64)> {
    let (mut i, mut j): (libc::c_ulong, libc::c_ulong) = (0, 0);
    // SAFETY: a NUL-terminated string, a NUL-terminated format and two c_ulong
    // out-pointers for its two %lu conversions.
    let n = unsafe {
        libc::sscanf(
            c.as_ptr(),
            c"%lu:%lu".as_ptr(),
            &mut i as *mut libc::c_ulong,
            &mut j as *mut libc::c_ulong,
        )
    };
    (n == 2).then_some((i, j))
}

/// The GPU one token selects (a MIG device by its parent), or `None`: unknown device.
fn select_one(dev: &str, gpus: &[Gpu]) -> Option<usize> {
    let c = CString::new(dev).ok()?;
    let prefixed =
        |p: &str| dev.len() > p.len() && dev.as_bytes()[..4].eq_ignore_ascii_case(p.as_bytes());
    if prefixed("GPU-") {
        if let Some(i) = gpus.iter().position(|g| eq_ignore_case(&g.uuid, dev)) {
            return Some(i);
        }
    }
    if let Some(buf) = pci_format(&c) {
        let hit = gpus.iter().position(|g| {
            g.busid.len() >= buf.len()
                && g.busid.as_bytes()[..buf.len()].eq_ignore_ascii_case(buf.as_bytes())
        });
        if hit.is_some() {
            return hit;
        }
    }
    if let Some(n) = index(&c).filter(|n| *n < gpus.len() as u64) {
        return Some(n as usize);
    }
    if prefixed("MIG-") {
        let hit = gpus
            .iter()
            .position(|g| g.migs.iter().any(|m| eq_ignore_case(m, dev)));
        if hit.is_some() {
            return hit;
        }
    }
    let (i, j) = mig_index(&c)?;
    let g = gpus.get(usize::try_from(i).ok()?)?;
    (j < g.migs.len() as u64).then_some(i as usize)
}

/// `select_devices` over a `--devices` list.
pub fn select_devices(devs: &str, gpus: &[Gpu]) -> Cli {
    let mut out = BTreeSet::new();
    for dev in devs.split(',').filter(|d| !d.is_empty()) {
        if dev.eq_ignore_ascii_case("all") {
            out.extend(0..gpus.len());
            break;
        }
        match select_one(dev, gpus) {
            Some(i) => drop(out.insert(i)),
            None => return Cli::Refused,
        }
    }
    Cli::Selected(out)
}

/// The GPU list a fuzz input describes: its first byte the count (0-4), then per GPU a
/// domain, bus and device byte and a MIG count (0-2). GPU `i` has minor `2i + 1`, so an
/// index read as a minor shows.
pub fn gpus_from(data: &[u8]) -> (Vec<Gpu>, &[u8]) {
    let n = data.first().map_or(0, |b| usize::from(b % 5));
    let mut rest = data.get(1..).unwrap_or(&[]);
    let mut gpus = Vec::new();
    for i in 0..n {
        let b = |k: usize| rest.get(k).copied().unwrap_or(0);
        let busid = format!("{:08X}:{:02X}:{:02X}.0", b(0) % 3, b(1), b(2) % 32);
        let migs = (0..usize::from(b(3) % 3))
            .map(|j| format!("MIG-{i:08x}-{j:04x}-0000-0000-000000000000"))
            .collect();
        gpus.push(Gpu {
            uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
            busid,
            migs,
        });
        rest = rest.get(4..).unwrap_or(&[]);
    }
    (gpus, rest)
}

fn minor(i: usize) -> u32 {
    2 * i as u32 + 1
}

/// devgate's reading of one token against the same GPUs: the minors it checks, and
/// whether it read a MIG UUID (which it cannot place).
fn devgate(token: &str, gpus: &[Gpu]) -> (BTreeSet<u32>, bool) {
    let known = KnownGpus {
        ids: Ok(gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuId {
                minor: minor(i),
                uuid: Some(g.uuid.clone()),
                pci: PciAddr::parse(&g.busid),
            })
            .collect()),
        by: "NVML",
    };
    let Some(sel) = parse(token) else {
        return (BTreeSet::new(), false);
    };
    let mig_uuid = matches!(sel, GpuSelector::MigUuid(_));
    let (chosen, _) = resolve_selectors(&[(sel, Source::NvidiaVisibleDevices)], &known, &[]);
    (chosen.into_iter().map(|(m, _)| m).collect(), mig_uuid)
}

/// The GPU the cli hands over for `token` that `ours` (the minors devgate checks) lacks.
fn missed(token: &str, gpus: &[Gpu], ours: &BTreeSet<u32>) -> Option<usize> {
    match select_devices(token, gpus) {
        Cli::Selected(cli) => cli.into_iter().find(|i| !ours.contains(&minor(*i))),
        Cli::Refused => None,
    }
}

/// The differential check on one token (no comma, as the toolkit hands each on): what
/// the cli hands over, devgate checks.
pub fn check(token: &str, gpus: &[Gpu]) {
    if token.contains(',') || token.is_empty() {
        return;
    }
    let (ours, mig_uuid) = devgate(token, gpus);
    if mig_uuid {
        return;
    }
    if let Some(i) = missed(token, gpus, &ours) {
        panic!("{token:?} on {gpus:?}: the cli hands over GPU {i}, devgate checks {ours:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<Gpu> {
        let (gpus, _) = gpus_from(&[3, 0, 0x1b, 0, 1, 0, 0x2b, 0, 2, 0, 0x3b, 0, 0]);
        gpus
    }

    #[test]
    fn the_model_follows_the_clis_order() {
        let g = three();
        let sel = |t: &str| select_devices(t, &g);
        let set = |v: &[usize]| Cli::Selected(v.iter().copied().collect());
        assert_eq!(sel("1:0:0"), set(&[1]), "no GPU at 1:00:00: MIG 1:0");
        assert_eq!(sel("0:2b:00.0"), set(&[1]), "a GPU's bus id");
        assert_eq!(sel("0:0b:00.0"), set(&[0]), "no GPU at 0b: MIG 0:0");
        assert_eq!(
            sel("0:4b:00.0"),
            Cli::Refused,
            "MIG 0:4: GPU 0 has one MIG device"
        );
        assert_eq!(sel("2:0:0"), Cli::Refused, "GPU 2 has no MIG device");
        assert_eq!(sel("+1,all"), set(&[0, 1, 2]));
        assert_eq!(sel("gpu-00000002-0000-0000-0000-000000000000"), set(&[2]));
        assert_eq!(sel("GPU-00000002"), Cli::Refused, "a full UUID only");
        assert_eq!(sel("MIG-00000001-0001-0000-0000-000000000000"), set(&[1]));
        assert_eq!(sel("3"), Cli::Refused);
    }

    /// The check holds devgate to the model: the attacker's spellings pass it now, and a
    /// devgate that stopped at the bus id (before the fall-through) fails it.
    #[test]
    fn devgate_reads_each_token_as_the_cli_does() {
        let g = three();
        for t in [
            "1:0:0",
            "0:1:ff",
            "+1:0:0",
            "1:2:-1",
            "0:2b:00.0",
            "0:4b:00.0",
            "1",
            "+2",
            " 0",
            "1:1",
            "0x1:0:0",
            "01:0:0.0",
            "all",
            "ALL",
        ] {
            check(t, &g);
        }
        // a reading that stops at the bus id (devgate before the fall-through) misses GPU 1
        assert_eq!(missed("1:0:0", &g, &BTreeSet::new()), Some(1));
        assert_eq!(missed("1:0:0", &g, &devgate("1:0:0", &g).0), None);
    }
}
