//! BPF_PROG_TYPE_CGROUP_DEVICE programs, emitted here in Rust; nothing is compiled or
//! loaded from anywhere else.
//! - `program`: a whole program from a device rule list, as runc's devicefilter builds one
//!   (the rules in order, the last matching rule decides, no match denies).
//! - `remap_prefix` + `compose`: a remap put in front of a program someone else attached
//!   (the runtime's, or one another hook already extended), which is kept as it is.
//!
//! The program sees `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`
//! where `access_type` is `(access << 16) | type`, type 1 block / 2 char, access bits
//! mknod 1, read 2, write 4.

use super::error::{ProgramError, RuleError};
use crate::model::device::{DevNum, DevType};
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};

pub const DEV_BLOCK: u32 = 1;
pub const DEV_CHAR: u32 = 2;
pub const ACC_MKNOD: u32 = 1;
pub const ACC_READ: u32 = 2;
pub const ACC_WRITE: u32 = 4;
const ACC_ALL: u32 = ACC_MKNOD | ACC_READ | ACC_WRITE;

/// One `struct bpf_insn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcode parts (linux/bpf_common.h, linux/bpf.h).
pub const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
pub const ALU32_AND_K: u8 = 0x54;
pub const ALU32_RSH_K: u8 = 0x74;
pub const ALU32_MOV_X: u8 = 0xbc;
pub const ALU64_MOV_K: u8 = 0xb7;
pub const JNE_K: u8 = 0x55;
pub const JNE_X: u8 = 0x5d;
pub const EXIT: u8 = 0x95;
// Used by runtimes' programs (crun, runc); the emulator knows them too.
pub const LDX_MEM_H: u8 = 0x69;
pub const ALU32_MOV_K: u8 = 0xb4;
pub const ALU64_MOV_X: u8 = 0xbf;
pub const JEQ_K: u8 = 0x15;
pub const JA: u8 = 0x05;
/// What a program may not contain to be copied as it is: a helper call (its immediate is
/// the kernel's, not the loader's), a 64-bit immediate load (a map or BTF reference), a
/// tail call or BPF-to-BPF call.
const CALL: u8 = 0x85;
const CALLX: u8 = 0x8d;
const LD_IMM64: u8 = 0x18;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R5: u8 = 5;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

/// A rule as the program tests it; `None` is a wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Match {
    typ: Option<u32>,
    major: Option<u32>,
    minor: Option<u32>,
    access: u32,
    allow: bool,
}

fn access_bits(s: Option<&str>) -> Result<u32, RuleError> {
    let s = s.unwrap_or("");
    if s.is_empty() {
        return Ok(ACC_ALL);
    }
    let mut bits = 0;
    for c in s.chars() {
        bits |= match c {
            'r' => ACC_READ,
            'w' => ACC_WRITE,
            'm' => ACC_MKNOD,
            _ => {
                return Err(RuleError::UnknownAccess {
                    access: s.to_string(),
                    letter: c,
                })
            }
        };
    }
    Ok(bits)
}

fn number(what: &'static str, n: Option<i64>, max: i64) -> Result<Option<u32>, RuleError> {
    match n {
        None => Ok(None),
        Some(n) if n < 0 => Ok(None), // -1 is the runtimes' wildcard
        Some(n) if n <= max => Ok(Some(n as u32)),
        Some(n) => Err(RuleError::OutOfRange { what, n }),
    }
}

fn to_match(r: &LinuxDeviceCgroup) -> Result<Option<Match>, RuleError> {
    let typ = match r.typ() {
        None | Some(LinuxDeviceType::A) => None,
        Some(LinuxDeviceType::C) | Some(LinuxDeviceType::U) => Some(DEV_CHAR),
        Some(LinuxDeviceType::B) => Some(DEV_BLOCK),
        Some(LinuxDeviceType::P) => return Ok(None), // a FIFO is no device
    };
    Ok(Some(Match {
        typ,
        major: number("major", r.major(), crate::model::device::MAX_MAJOR)?,
        minor: number("minor", r.minor(), crate::model::device::MAX_MINOR)?,
        access: access_bits(r.access().as_deref())?,
        allow: r.allow(),
    }))
}

/// The program for `rules`. Rules are tested last to first and the first that matches
/// returns; a rule that matches everything ends the program (the verifier refuses
/// unreachable instructions), else the tail denies.
pub fn program(rules: &[LinuxDeviceCgroup]) -> Result<Vec<Insn>, RuleError> {
    let mut prog = vec![
        insn(LDX_MEM_W, R2, R1, 0, 0),
        insn(ALU32_AND_K, R2, 0, 0, 0xffff),
        insn(LDX_MEM_W, R3, R1, 0, 0),
        insn(ALU32_RSH_K, R3, 0, 0, 16),
        insn(LDX_MEM_W, R4, R1, 4, 0),
        insn(LDX_MEM_W, R5, R1, 8, 0),
    ];
    let matches: Vec<Match> = rules
        .iter()
        .map(to_match)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    for m in matches.iter().rev() {
        // Jumps are emitted with the index of the block's end; fixed up below.
        let mut block: Vec<Insn> = Vec::new();
        let mut jumps = Vec::new();
        if let Some(t) = m.typ {
            jumps.push(block.len());
            block.push(insn(JNE_K, R2, 0, 0, t as i32));
        }
        if m.access != ACC_ALL {
            block.push(insn(ALU32_MOV_X, R1, R3, 0, 0));
            block.push(insn(ALU32_AND_K, R1, 0, 0, m.access as i32));
            jumps.push(block.len());
            block.push(insn(JNE_X, R1, R3, 0, 0));
        }
        if let Some(v) = m.major {
            jumps.push(block.len());
            block.push(insn(JNE_K, R4, 0, 0, v as i32));
        }
        if let Some(v) = m.minor {
            jumps.push(block.len());
            block.push(insn(JNE_K, R5, 0, 0, v as i32));
        }
        block.push(insn(ALU64_MOV_K, R0, 0, 0, i32::from(m.allow)));
        block.push(insn(EXIT, 0, 0, 0, 0));
        let len = block.len();
        for j in &jumps {
            block[*j].off = (len - j - 1) as i16;
        }
        prog.extend(block);
        if jumps.is_empty() {
            return Ok(prog);
        }
    }
    prog.push(insn(ALU64_MOV_K, R0, 0, 0, 0));
    prog.push(insn(EXIT, 0, 0, 0, 0));
    Ok(prog)
}

/// Instructions that decide for every access to the devices in `deny` (0) and `allow` (1)
/// and fall through for any other request, leaving R1 (the context) as the program after
/// them expects it. Only R0, R2, R4 and R5 are written, and every program written after a
/// prefix sets a register before it reads it (the verifier makes sure of it).
pub fn remap_prefix(deny: &[DevNum], allow: &[DevNum]) -> Vec<Insn> {
    let mut prog = vec![
        insn(LDX_MEM_W, R2, R1, 0, 0),
        insn(ALU32_AND_K, R2, 0, 0, 0xffff),
        insn(LDX_MEM_W, R4, R1, 4, 0),
        insn(LDX_MEM_W, R5, R1, 8, 0),
    ];
    let tagged = deny
        .iter()
        .map(|d| (d, 0))
        .chain(allow.iter().map(|d| (d, 1)));
    for (d, verdict) in tagged {
        let typ = match d.typ {
            DevType::Char => DEV_CHAR,
            DevType::Block => DEV_BLOCK,
        };
        prog.extend([
            insn(JNE_K, R2, 0, 4, typ as i32),
            insn(JNE_K, R4, 0, 3, d.major as i32),
            insn(JNE_K, R5, 0, 2, d.minor as i32),
            insn(ALU64_MOV_K, R0, 0, 0, verdict),
            insn(EXIT, 0, 0, 0, 0),
        ]);
    }
    prog
}

/// `prefix` in front of an attached program's instructions. The program's jumps are
/// relative, so they stay right. With no program (a cgroup whose runtime attached none
/// allows everything) the prefix is followed by "allow".
pub fn compose(prefix: &[Insn], program: Option<&[Insn]>) -> Vec<Insn> {
    let mut out = prefix.to_vec();
    match program {
        Some(p) => out.extend_from_slice(p),
        None => out.extend([insn(ALU64_MOV_K, R0, 0, 0, 1), insn(EXIT, 0, 0, 0, 0)]),
    }
    out
}

/// Why a program read back from the kernel cannot be copied as it is, if it cannot.
pub fn not_copyable(prog: &[Insn]) -> Option<ProgramError> {
    if prog.is_empty() {
        return Some(ProgramError::NoInstructions);
    }
    prog.iter().enumerate().find_map(|(at, x)| match x.code {
        CALL | CALLX => Some(ProgramError::Call { at }),
        LD_IMM64 if x.src != 0 => Some(ProgramError::ObjectReference { at }),
        _ => None,
    })
}

/// Instructions from the kernel's layout.
pub fn decode(raw: &[u64]) -> Vec<Insn> {
    raw.iter()
        .map(|w| {
            let b = w.to_ne_bytes();
            Insn {
                code: b[0],
                dst: b[1] & 0xf,
                src: b[1] >> 4,
                off: i16::from_le_bytes([b[2], b[3]]),
                imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            }
        })
        .collect()
}

/// The instructions as the kernel takes them.
pub fn encode(prog: &[Insn]) -> Vec<u64> {
    prog.iter()
        .map(|i| {
            let mut b = [0u8; 8];
            b[0] = i.code;
            b[1] = (i.dst & 0xf) | ((i.src & 0xf) << 4);
            b[2..4].copy_from_slice(&i.off.to_le_bytes());
            b[4..8].copy_from_slice(&i.imm.to_le_bytes());
            u64::from_ne_bytes(b)
        })
        .collect()
}

/// Runs a program over one request; the test's independent reading of the instructions.
/// Returns `None` on an instruction it does not know or a jump out of the program.
#[cfg(test)]
pub fn emulate(prog: &[Insn], typ: u32, access: u32, major: u32, minor: u32) -> Option<u64> {
    let ctx = [(access << 16) | typ, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..4096 {
        let i = prog.get(pc)?;
        let (d, s) = (i.dst as usize, i.src as usize);
        if d > 10 || s > 10 {
            return None;
        }
        let mut next = pc + 1;
        match i.code {
            LDX_MEM_W => {
                if s != 1 || i.off < 0 || i.off % 4 != 0 {
                    return None;
                }
                r[d] = u64::from(*ctx.get((i.off / 4) as usize)?);
            }
            LDX_MEM_H => {
                // little-endian halves of the context words
                if s != 1 || i.off < 0 || i.off % 2 != 0 {
                    return None;
                }
                let w = *ctx.get((i.off / 4) as usize)?;
                r[d] = u64::from(if i.off % 4 == 0 { w & 0xffff } else { w >> 16 });
            }
            ALU32_MOV_K => r[d] = u64::from(i.imm as u32),
            ALU64_MOV_X => r[d] = r[s],
            JA => next = (pc as i64 + 1 + i64::from(i.off)).try_into().ok()?,
            JEQ_K => {
                if r[d] == i.imm as i64 as u64 {
                    next = (pc as i64 + 1 + i64::from(i.off)).try_into().ok()?;
                }
            }
            ALU32_AND_K => r[d] = u64::from((r[d] as u32) & (i.imm as u32)),
            ALU32_RSH_K => r[d] = u64::from((r[d] as u32) >> (i.imm as u32 & 31)),
            ALU32_MOV_X => r[d] = u64::from(r[s] as u32),
            ALU64_MOV_K => r[d] = i.imm as i64 as u64,
            JNE_K | JNE_X => {
                let rhs = if i.code == JNE_K {
                    i.imm as i64 as u64
                } else {
                    r[s]
                };
                if r[d] != rhs {
                    next = (pc as i64 + 1 + i64::from(i.off)).try_into().ok()?;
                }
            }
            EXIT => return Some(r[0]),
            _ => return None,
        }
        pc = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::LinuxDeviceCgroupBuilder;

    fn rule(
        allow: bool,
        t: Option<LinuxDeviceType>,
        maj: Option<i64>,
        min: Option<i64>,
        acc: &str,
    ) -> LinuxDeviceCgroup {
        let mut b = LinuxDeviceCgroupBuilder::default().allow(allow).access(acc);
        if let Some(t) = t {
            b = b.typ(t);
        }
        if let Some(m) = maj {
            b = b.major(m);
        }
        if let Some(m) = min {
            b = b.minor(m);
        }
        b.build().unwrap()
    }

    use LinuxDeviceType::{A, B as Blk, C};
    const R: u32 = ACC_READ;
    const W: u32 = ACC_WRITE;
    const M: u32 = ACC_MKNOD;

    /// A runc-shaped container: deny all, its GPU, runc's defaults, then the remap.
    fn remapped() -> Vec<LinuxDeviceCgroup> {
        let mut v = vec![
            rule(false, None, None, None, "rwm"),
            rule(true, Some(C), Some(195), Some(1), "rw"),
        ];
        v.extend(crate::action::cgroup::runtime_default_rules());
        v.push(rule(false, Some(C), Some(195), Some(1), "rwm"));
        v.push(rule(true, Some(C), Some(195), Some(7), "rwm"));
        v
    }

    #[test]
    fn remapped_rules_allow_spare_and_defaults_deny_bad() {
        let p = program(&remapped()).unwrap();
        let run = |t, a, ma, mi| emulate(&p, t, a, ma, mi).expect("program runs to exit");
        assert_eq!(run(DEV_CHAR, R | W, 195, 7), 1, "spare");
        assert_eq!(run(DEV_CHAR, R, 195, 1), 0, "bad device read");
        assert_eq!(run(DEV_CHAR, M, 195, 1), 0, "bad device mknod");
        assert_eq!(run(DEV_CHAR, R | W, 1, 3), 1, "/dev/null");
        assert_eq!(run(DEV_CHAR, R | W, 136, 9), 1, "pts wildcard minor");
        assert_eq!(run(DEV_CHAR, M, 250, 2), 1, "mknod of any char");
        assert_eq!(run(DEV_CHAR, R, 250, 2), 0, "read of an unlisted char");
        assert_eq!(run(DEV_BLOCK, R, 8, 0), 0, "unlisted block");
        assert_eq!(run(DEV_BLOCK, M, 8, 0), 1, "mknod of any block");
        assert_eq!(run(DEV_CHAR, R, 195, 2), 0, "another GPU");
    }

    #[test]
    fn partial_access_last_rule_wins_and_wildcards() {
        let p = program(&[rule(true, Some(C), Some(10), Some(1), "r")]).unwrap();
        assert_eq!(emulate(&p, DEV_CHAR, R, 10, 1), Some(1));
        assert_eq!(emulate(&p, DEV_CHAR, R | W, 10, 1), Some(0));
        assert_eq!(emulate(&p, DEV_BLOCK, R, 10, 1), Some(0));
        // later rules override earlier ones
        let p = program(&[
            rule(true, Some(C), Some(10), None, "rwm"),
            rule(false, Some(C), Some(10), Some(5), "w"),
        ])
        .unwrap();
        assert_eq!(emulate(&p, DEV_CHAR, R, 10, 5), Some(1));
        assert_eq!(emulate(&p, DEV_CHAR, W, 10, 5), Some(0));
        assert_eq!(emulate(&p, DEV_CHAR, W, 10, 6), Some(1));
        // an allow-all as the last rule ends the program right there
        let p = program(&[
            rule(false, None, None, None, "rwm"),
            rule(true, Some(A), Some(-1), None, ""),
        ])
        .unwrap();
        assert_eq!(p.len(), 6 + 2);
        assert_eq!(emulate(&p, DEV_BLOCK, R | W | M, 259, 0), Some(1));
        // no rules: deny everything
        let p = program(&[]).unwrap();
        assert_eq!(emulate(&p, DEV_CHAR, R, 1, 3), Some(0));
        // 'u' is char, 'p' is no device at all
        let p = program(&[
            rule(true, Some(LinuxDeviceType::U), Some(4), Some(1), "rw"),
            rule(true, Some(LinuxDeviceType::P), None, None, "rwm"),
        ])
        .unwrap();
        assert_eq!(emulate(&p, DEV_CHAR, R, 4, 1), Some(1));
        assert_eq!(emulate(&p, DEV_CHAR, R, 4, 2), Some(0));
        let _ = Blk;
    }

    #[test]
    fn bad_rules_are_refused() {
        let e = program(&[rule(true, Some(C), Some(1), Some(3), "rx")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device rule access \"rx\": unknown access 'x'"
        );
        let e = program(&[rule(true, Some(C), Some(1 << 40), Some(3), "r")]).unwrap_err();
        assert_eq!(
            e,
            RuleError::OutOfRange {
                what: "major",
                n: 1 << 40
            }
        );
        assert_eq!(
            e.to_string(),
            "device rule major 1099511627776 out of range"
        );
    }

    #[test]
    fn encoding_matches_the_kernel_layout() {
        let e = encode(&[insn(LDX_MEM_W, R4, R1, 4, 0), insn(JNE_K, R5, 0, 3, 7)]);
        assert_eq!(e[0].to_ne_bytes(), [0x61, 0x14, 4, 0, 0, 0, 0, 0]);
        assert_eq!(e[1].to_ne_bytes(), [0x55, 0x05, 3, 0, 7, 0, 0, 0]);
    }

    const BAD: DevNum = DevNum {
        typ: DevType::Char,
        major: 1,
        minor: 5,
    };
    const SPARE: DevNum = DevNum {
        typ: DevType::Char,
        major: 1,
        minor: 7,
    };

    /// crun's shape for "deny all, allow c 1:5 rw": a 16-bit type load, JEQ on the access
    /// mask, R1 reused as scratch.
    fn crun_like() -> Vec<Insn> {
        vec![
            insn(LDX_MEM_H, R2, R1, 0, 0),
            insn(LDX_MEM_W, R3, R1, 0, 0),
            insn(ALU32_RSH_K, R3, 0, 0, 16),
            insn(LDX_MEM_W, R4, R1, 4, 0),
            insn(LDX_MEM_W, R5, R1, 8, 0),
            insn(JNE_K, R2, 0, 7, DEV_CHAR as i32),
            insn(ALU32_MOV_X, R1, R3, 0, 0),
            insn(ALU32_AND_K, R1, 0, 0, (R | W) as i32),
            insn(JEQ_K, R1, 0, 4, 0),
            insn(JNE_K, R4, 0, 3, 1),
            insn(JNE_K, R5, 0, 2, 5),
            insn(ALU64_MOV_K, R0, 0, 0, 1),
            insn(EXIT, 0, 0, 0, 0),
            insn(ALU32_MOV_K, R0, 0, 0, 0),
            insn(JA, 0, 0, 0, 0),
            insn(EXIT, 0, 0, 0, 0),
        ]
    }

    #[test]
    fn prefix_decides_bad_and_spare_and_leaves_the_rest_to_the_program() {
        let prefix = remap_prefix(&[BAD], &[SPARE]);
        for body in [program(&remapped()[..13]).unwrap(), crun_like()] {
            let p = compose(&prefix, Some(&body));
            for acc in [R, W, M, R | W, R | W | M] {
                assert_eq!(emulate(&p, DEV_CHAR, acc, 1, 5), Some(0), "bad {acc}");
                assert_eq!(emulate(&p, DEV_CHAR, acc, 1, 7), Some(1), "spare {acc}");
                // everything else exactly as the program alone decides
                for (t, ma, mi) in [
                    (DEV_CHAR, 1, 3),
                    (DEV_CHAR, 195, 1),
                    (DEV_BLOCK, 1, 5),
                    (DEV_CHAR, 5, 7),
                ] {
                    assert_eq!(
                        emulate(&p, t, acc, ma, mi),
                        emulate(&body, t, acc, ma, mi),
                        "{t} {acc} {ma}:{mi}"
                    );
                }
            }
        }
        // the crun-like program alone allows 1:5 and denies 1:7, so the prefix is what
        // changes them
        let c = crun_like();
        assert_eq!(emulate(&c, DEV_CHAR, R, 1, 5), Some(1));
        assert_eq!(emulate(&c, DEV_CHAR, R, 1, 7), Some(0));
    }

    #[test]
    fn prefix_over_no_program_denies_only_the_bad_device() {
        let p = compose(&remap_prefix(&[BAD], &[SPARE]), None);
        assert_eq!(emulate(&p, DEV_CHAR, R | W, 1, 5), Some(0));
        assert_eq!(emulate(&p, DEV_CHAR, R | W, 1, 7), Some(1));
        assert_eq!(
            emulate(&p, DEV_BLOCK, R | W, 1, 5),
            Some(1),
            "block 1:5 is another device"
        );
        assert_eq!(emulate(&p, DEV_CHAR, R | W, 8, 0), Some(1));
    }

    #[test]
    fn prefixes_stack_for_a_second_remap() {
        let other = DevNum {
            typ: DevType::Block,
            major: 8,
            minor: 16,
        };
        let spare2 = DevNum {
            typ: DevType::Block,
            major: 8,
            minor: 32,
        };
        let once = compose(&remap_prefix(&[BAD], &[SPARE]), Some(&crun_like()));
        let twice = compose(&remap_prefix(&[other], &[spare2]), Some(&once));
        assert_eq!(emulate(&twice, DEV_CHAR, R, 1, 5), Some(0));
        assert_eq!(emulate(&twice, DEV_CHAR, R, 1, 7), Some(1));
        assert_eq!(emulate(&twice, DEV_BLOCK, R, 8, 16), Some(0));
        assert_eq!(emulate(&twice, DEV_BLOCK, R, 8, 32), Some(1));
        assert_eq!(
            emulate(&twice, DEV_CHAR, R, 1, 3),
            Some(0),
            "crun denies 1:3"
        );
    }

    #[test]
    fn decode_reverses_encode_and_calls_are_not_copied() {
        let p = crun_like();
        assert_eq!(decode(&encode(&p)), p);
        let neg = [insn(JNE_K, R5, 0, -3, -7)];
        assert_eq!(decode(&encode(&neg)), neg);
        assert_eq!(not_copyable(&p), None);
        let mut with_call = p.clone();
        with_call.insert(3, insn(CALL, 0, 0, 0, 14));
        assert_eq!(not_copyable(&with_call), Some(ProgramError::Call { at: 3 }));
        assert_eq!(
            not_copyable(&with_call).unwrap().to_string(),
            "instruction 3 is a call"
        );
        let map = [insn(LD_IMM64, R1, 1, 0, 5), insn(0, 0, 0, 0, 0)];
        assert_eq!(
            not_copyable(&map),
            Some(ProgramError::ObjectReference { at: 0 })
        );
        assert!(not_copyable(&map).unwrap().to_string().contains("map"));
        let plain = [insn(LD_IMM64, R1, 0, 0, 5), insn(0, 0, 0, 0, 0)];
        assert_eq!(not_copyable(&plain), None);
        assert!(not_copyable(&[]).is_some());
    }
}
