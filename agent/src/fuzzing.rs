//! The fuzz targets' entry (fuzz/fuzz_targets/agent_inward.rs): the agent's readers of
//! ResourceSlices, DeviceTaintRules and ResourceClaims, as one sync runs them, from any
//! bytes. Whatever the objects say, the file the hook reads keeps its bounds.

use crate::dra::{node_devices, DeviceTaintRule, List, ResourceClaim, ResourceSlice};
use crate::inward::{file, file_taints, taints_here};
use crate::verdicts::NodeGpu;
use devgate::store::cluster::{file_bytes, MAX_TAINTS_BYTES};

const NODE: &str = "n1";
const GPU_DRIVER: &str = "gpu.nvidia.com";

/// The input: three JSON lists, one per line (slices, rules, claims), as the API server
/// answers a list. A line that does not parse is an empty list.
pub fn agent_inward(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(3, '\n');
    let slices: List<ResourceSlice> = list(lines.next());
    let rules: List<DeviceTaintRule> = list(lines.next());
    let claims: List<ResourceClaim> = list(lines.next());
    let devices = node_devices(&slices.items, NODE, GPU_DRIVER);
    let gpus: Vec<NodeGpu> = (0..8)
        .map(|i| NodeGpu {
            uuid: Some(format!("GPU-{i}")),
            pci_bus_id: Some(format!("0000:{i:02x}:00.0")),
        })
        .collect();
    for known in [None, Some(&gpus[..])] {
        let found = taints_here(&rules.items, &devices, NODE, known);
        let f = file(NODE, 1, file_taints(&found, &claims.items));
        let bytes = file_bytes(&f);
        assert!(bytes as u64 <= MAX_TAINTS_BYTES, "{bytes} bytes");
        f.check_bounds().expect("the file keeps its bounds");
    }
}

fn list<T: serde::de::DeserializeOwned>(line: Option<&str>) -> List<T> {
    line.and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(List { items: Vec::new() })
}

#[cfg(test)]
mod tests {
    /// The checked-in seeds run as a test: the fuzz target's property holds on them.
    #[test]
    fn the_seeds_keep_the_files_bounds() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/agent_inward");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            super::agent_inward(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0);
        super::agent_inward(b"");
        super::agent_inward(b"\xff\n{\n[");
    }
}
