//! The node agent's cluster taints file, as the hook reads it: whatever parses keeps its
//! bounds, reads back the same once written, and every taint's reject line is one
//! bounded line.

use crate::probe::cluster::detail;
use crate::store::cluster::{self, ClusterTaints};
use std::path::Path;

/// `cluster-taints.json`.
pub fn cluster_taints(data: &[u8]) {
    let Ok(t) = cluster::parse(data, Path::new("cluster-taints.json")) else {
        return;
    };
    assert!(t.check_bounds().is_ok());
    let json = serde_json::to_vec(&t).expect("devgate's own types serialize");
    let back: ClusterTaints =
        serde_json::from_slice(&json).expect("what the agent writes, the hook reads");
    assert_eq!(back, t);
    for taint in &t.taints {
        let line = detail(taint);
        assert!(!line.contains(['\n', '\r', '\x1b']), "{line}");
        assert!(
            line.chars().count() <= 2100,
            "{} characters",
            line.chars().count()
        );
    }
}
