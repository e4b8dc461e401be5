//! `update`: kubelet's CPU manager makes containerd call UpdateContainerResources, and
//! containerd passes the container's *whole* stored `linux.resources` to
//! `<runtime> update --resources - <id>`, device rules included: the rules from before any
//! remap. runc (1.0 and later) leaves device rules alone on update; crun 1.8 writes them,
//! re-allowing the bad device and dropping the spare. So for a container that holds spares
//! the wrapper rewrites those rules as the create did (a deny-all, the allows without the
//! bad device, the spare) before the runtime reads them. Resources without device rules are passed on as they are.

use super::spec_rewrite::{remap_rules, Swap};
use crate::error::Result;
use crate::fsutil::read_bounded;
use crate::store::lease::Lease;
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// Resources are a few KiB; a bound keeps a hostile or broken writer from filling memory.
pub const MAX_RESOURCES_BYTES: u64 = 4 << 20;

/// The swaps a container's leases stand for.
pub fn swaps(leases: &[Lease]) -> Vec<Swap> {
    leases
        .iter()
        .map(|l| Swap {
            bad: l.replaces,
            spare: l.spare,
            spare_path: l.spare_path.clone(),
        })
        .collect()
}

/// The resources with the remap kept. Input that is not a JSON object with a `devices`
/// list is returned as it was: the runtime reports its own errors, and resources without
/// device rules change none.
pub fn rewrite(input: &[u8], swaps: &[Swap]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(input) else {
        return input.to_vec();
    };
    let Some(devices) = v.get_mut("devices").and_then(Value::as_array_mut) else {
        return input.to_vec();
    };
    if let Err(e) = remap_rules(devices, swaps) {
        // The create took these rules, so this is not expected; without `devices` runc and
        // crun keep the rules the container has, the remap's.
        log::warn!("update: device rules left as the create set them: {e}");
        if let Some(o) = v.as_object_mut() {
            o.remove("devices");
        }
    }
    serde_json::to_vec(&v).unwrap_or_else(|_| input.to_vec())
}

pub fn read(r: impl Read, what: &Path) -> Result<Vec<u8>> {
    read_bounded(r, MAX_RESOURCES_BYTES, "update resources", what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{DevNum, DevType};
    use serde_json::json;

    fn c(major: u32, minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major,
            minor,
        }
    }

    #[test]
    fn containerd_resources_keep_the_remap() {
        // What containerd sends: the stored spec's resources, from before the remap.
        let input = json!({
            "devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 10, "minor": 229, "access": "rwm"}
            ],
            "cpu": {"shares": 512, "cpus": "0-1"},
            "memory": {"limit": 1073741824}
        });
        let out = rewrite(
            input.to_string().as_bytes(),
            &[Swap {
                bad: c(10, 229),
                spare: c(10, 237),
                spare_path: "/dev/loop-control".into(),
            }],
        );
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["cpu"], input["cpu"]);
        assert_eq!(out["memory"], input["memory"]);
        // The shape the create wrote: a deny-all, the allows without the bad device, the
        // spare.
        assert_eq!(
            out["devices"],
            json!([
                {"allow": false, "type": "a", "access": "rwm"},
                {"allow": true, "type": "c", "major": 10, "minor": 237, "access": "rwm"}
            ])
        );
    }

    #[test]
    fn without_device_rules_or_not_json_it_is_unchanged() {
        let s = [Swap {
            bad: c(1, 1),
            spare: c(1, 2),
            spare_path: "/x".into(),
        }];
        for input in [&br#"{"cpu":{"shares":2}}"#[..], b"not json", b"[1]"] {
            assert_eq!(rewrite(input, &s), input);
        }
        // an empty list is rules all the same: crun would deny everything but its defaults
        let out: Value = serde_json::from_slice(&rewrite(br#"{"devices":[]}"#, &s)).unwrap();
        assert_eq!(out["devices"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn memfd_reads_back_from_the_start() {
        let mut f = crate::fsutil::program::memfd("devgate-resources", b"hello").unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    }
}
