//! The kernel log scan (`make bench-kmsg`): a 60,000-record log from a file, and the
//! node's own /dev/kmsg, each beside its floor measured in the same run, interleaved.
//!
//! - file floor: reading the file's bytes with the same reads, nothing parsed;
//! - file scan: `read_kmsg`, what a hook call without a cache does;
//! - file, cache warm: `read_with_history` when the cache covers the file (a poststop after
//!   its prestart, the next start on a quiet node);
//! - /dev/kmsg floor: one read(2) per record until EAGAIN, nothing parsed (the kernel's
//!   own cost, which no reader can go below);
//! - /dev/kmsg scan and cache warm: the same two readers on the real device.
//!
//! The ring here holds what the host logged; `KMSG_INJECT=N` first writes N user-facility
//! lines (`<14>devgate-bench: …`, harmless: nothing reads user-facility lines as the
//! driver's) to make it a busy node's. `KMSG_ROUNDS` (default 30) sets the rounds.

use devgate::gpu::kmsg::{read_kmsg, ReadLimits};
use devgate::gpu::xid_history::read_with_history;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RECORDS: u64 = 60_000;

/// A busy node's log: kernel chatter of realistic lengths, dictionary lines, some user
/// facility lines, and a few NVRM records (a driver load, `GPU at` lines, XIDs).
fn log() -> String {
    let mut s = String::new();
    for i in 0..RECORDS {
        let ts = i * 1_337;
        let line = match i % 1000 {
            0 => format!("4,{i},{ts},-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"),
            500 => format!("4,{i},{ts},-;NVRM: GPU at PCI:0000:3b:00: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375\n"),
            501 => format!("4,{i},{ts},-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python3, Graphics Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Encoding\n"),
            n if n % 7 == 0 => format!("6,{i},{ts},-;IPv6: ADDRCONF(NETDEV_CHANGE): cali{n:08x}: link becomes ready\n SUBSYSTEM=net\n DEVICE=n{n}\n"),
            n if n % 5 == 0 => format!("14,{i},{ts},-;kubelet[2211]: I1203 04:11:48.{n:06} pod_workers.go:1298] \"Error syncing pod, skipping\"\n"),
            n => format!("6,{i},{ts},-;eth0: renamed from tmp{n:05x}; audit: type=1400 audit({i}.{n}:42): apparmor=\"STATUS\" operation=\"profile_load\"\n"),
        };
        s.push_str(&line);
    }
    s
}

/// Reads `path` to its end without parsing: per read(2), what the kernel hands over.
fn floor(path: &Path, buf_len: usize) -> usize {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap();
    let mut buf = vec![0u8; buf_len];
    let mut reads = 0;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => reads += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    reads
}

/// The scanner as it was before this bench (commit 6b78219): a copy of each line, the
/// whole line through `from_utf8_lossy`, the header split as text, 64 KiB reads. Kept to
/// show the change side by side; it uses the same XID and driver-load parsers.
mod before {
    use devgate::gpu::kmsg::{is_driver_load, parse_xid};
    use std::fs::OpenOptions;
    use std::io::{ErrorKind, Read};
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    fn parse_record(line: &str) -> Option<(u32, u64, &str)> {
        let (prefix, msg) = line.split_once(';')?;
        let mut f = prefix.split(',');
        let pri: u32 = f.next()?.parse().ok()?;
        let seq: u64 = f.next()?.parse().ok()?;
        let _ts: u64 = f.next()?.parse().ok()?;
        Some((pri, seq, msg))
    }

    fn line(line: &[u8], n: &mut (usize, usize)) {
        if line.is_empty() || line[0] == b' ' {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let Some((pri, _seq, msg)) = parse_record(&text) else {
            return;
        };
        n.0 += 1;
        if pri >> 3 != 0 || !msg.starts_with("NVRM: ") {
            return;
        }
        let _ = is_driver_load(msg);
        if parse_xid(msg).is_some() {
            n.1 += 1;
        }
    }

    /// (records, XID reports)
    pub fn read(path: &Path) -> (usize, usize) {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut carry: Vec<u8> = Vec::new();
        let mut n = (0, 0);
        loop {
            let got = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) => panic!("{e}"),
            };
            let mut chunk = &buf[..got];
            while !chunk.is_empty() {
                let (l, rest, complete) = match chunk.iter().position(|&b| b == b'\n') {
                    Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                    None => (chunk, &[][..], false),
                };
                chunk = rest;
                carry.extend_from_slice(l);
                if complete {
                    let l = std::mem::take(&mut carry);
                    line(&l, &mut n);
                }
            }
        }
        n
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Case<'a> {
    name: &'static str,
    run: Box<dyn FnMut() -> usize + 'a>,
    times: Vec<Duration>,
    records: usize,
}

/// Every case once per round, in the same order, `rounds` times: drift hits all alike.
fn measure(cases: &mut [Case], rounds: usize) {
    for c in cases.iter_mut() {
        c.records = (c.run)(); // warm: page cache, cache file
    }
    for _ in 0..rounds {
        for c in cases.iter_mut() {
            let t = Instant::now();
            let n = (c.run)();
            c.times.push(t.elapsed());
            assert!(n > 0 || c.records == 0);
        }
    }
}

fn report(title: &str, cases: &mut [Case], per_record_of: usize) {
    println!("{title}");
    let floor_t = median(&mut cases[0].times.clone());
    for c in cases.iter_mut() {
        let m = median(&mut c.times);
        println!(
            "  {:<28} median {:>9.3} ms   {:>6.3} us/record   {:>5.2}x the floor",
            c.name,
            m.as_secs_f64() * 1e3,
            m.as_secs_f64() * 1e6 / per_record_of.max(1) as f64,
            m.as_secs_f64() / floor_t.as_secs_f64()
        );
    }
}

fn main() {
    let rounds: usize = std::env::var("KMSG_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    // state_dir is tmpfs on a node (/run); /dev/shm is tmpfs where /run is not writable
    let tmpfs = ["/run", "/dev/shm"]
        .iter()
        .map(PathBuf::from)
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    let dir = tmpfs.join(format!("devgate-bench-kmsg-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("kmsg");
    fs::write(&path, log()).unwrap();
    let state = dir.join("state");
    let proc = PathBuf::from("/proc");
    let lim = ReadLimits::default();
    let full = read_kmsg(&path, lim).unwrap();
    assert_eq!(full.records as u64, RECORDS);
    assert_eq!(full.events.len(), 60);
    println!(
        "kernel log file: {} records, {} bytes, {} XID reports, {} rounds",
        full.records,
        fs::metadata(&path).unwrap().len(),
        full.events.len(),
        rounds
    );
    let mut file_cases = vec![
        Case {
            name: "floor (read, no parse)",
            run: Box::new(|| floor(&path, 1 << 20)),
            times: vec![],
            records: 0,
        },
        Case {
            name: "before (6b78219)",
            run: Box::new(|| {
                let (records, xids) = before::read(&path);
                assert_eq!(xids, 60);
                records
            }),
            times: vec![],
            records: 0,
        },
        Case {
            name: "read_kmsg",
            run: Box::new(|| read_kmsg(&path, lim).unwrap().records),
            times: vec![],
            records: 0,
        },
        Case {
            name: "read_with_history, warm",
            run: Box::new(|| {
                let s = read_with_history(&path, lim, &state, &proc).unwrap();
                assert_eq!(s.events.len(), 60);
                1
            }),
            times: vec![],
            records: 0,
        },
    ];
    measure(&mut file_cases, rounds);
    report(
        "60,000 records from a file",
        &mut file_cases,
        RECORDS as usize,
    );

    let dev = Path::new("/dev/kmsg");
    if read_kmsg(dev, lim).is_err() {
        println!("/dev/kmsg: not readable here (needs root); skipped");
        let _ = fs::remove_dir_all(&dir);
        return;
    }
    if let Some(n) = std::env::var("KMSG_INJECT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // printk.devkmsg=ratelimit allows each opener 10 lines per 5 s: a fresh open
        // every 10 lines
        for start in (0..n).step_by(10) {
            let mut k = File::options().write(true).open(dev).unwrap();
            for i in start..(start + 10).min(n) {
                // user facility, info: what any process may log; never a driver line
                let line = format!("<14>devgate-bench: filler record {i}\n");
                let _ = k.write_all(line.as_bytes());
            }
        }
    }
    let ring = read_kmsg(dev, lim).unwrap().records;
    let dev_state = dir.join("dev-state");
    let mut dev_cases = vec![
        Case {
            name: "floor (read(2) per record)",
            run: Box::new(|| floor(dev, 64 << 10)),
            times: vec![],
            records: 0,
        },
        Case {
            name: "before (6b78219)",
            run: Box::new(|| before::read(dev).0),
            times: vec![],
            records: 0,
        },
        Case {
            name: "read_kmsg",
            run: Box::new(|| read_kmsg(dev, lim).unwrap().records),
            times: vec![],
            records: 0,
        },
        Case {
            name: "read_with_history, warm",
            run: Box::new(|| {
                read_with_history(dev, lim, &dev_state, &proc)
                    .unwrap()
                    .records
            }),
            times: vec![],
            records: 0,
        },
    ];
    measure(&mut dev_cases, rounds);
    report(
        &format!("/dev/kmsg, {ring} records in the ring"),
        &mut dev_cases,
        ring,
    );
    let _ = fs::remove_dir_all(&dir);
}
