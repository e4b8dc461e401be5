//! What the agent says of itself: the status file `devgate doctor` reads
//! (`<state_dir>/agent-status.json`) and its own metrics. The file also carries the
//! devices it last published as bad, so a restarted agent tells only real transitions.

use devgate::store::cluster::{read_status, AgentStatus};
use std::path::Path;

/// The status file's content (devgate's type: doctor reads it).
pub type Report = AgentStatus;

/// The last report a previous agent on this node left, if any is readable.
pub fn previous(state_dir: &Path) -> Option<Report> {
    read_status(state_dir).ok().flatten()
}

/// The agent's own metric families, Prometheus text.
pub fn metrics(r: &Report) -> String {
    let g = |name: &str, help: &str, kind: &str, v: u64| {
        format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n")
    };
    [
        g(
            "devgate_agent_api_up",
            "1 when the agent's last sync with the API server succeeded.",
            "gauge",
            r.api_ok as u64,
        ),
        g(
            "devgate_agent_api_errors_total",
            "Failed syncs with the API server since the agent started.",
            "counter",
            r.api_errors,
        ),
        g(
            "devgate_agent_status_errors_total",
            "Failed runs of devgate status since the agent started.",
            "counter",
            r.status_errors,
        ),
        g(
            "devgate_agent_last_sync_timestamp_seconds",
            "When the agent last synced with the API server.",
            "gauge",
            r.last_sync_unix,
        ),
        g(
            "devgate_agent_device_taint_rules",
            "DeviceTaintRules this agent keeps for this node's bad devices.",
            "gauge",
            r.rules as u64,
        ),
        g(
            "devgate_agent_cluster_taints",
            "Cluster taints on this node's devices passed to the gate.",
            "gauge",
            r.inward_taints as u64,
        ),
        g(
            "devgate_agent_device_taint_rules_wanted",
            "DeviceTaintRules this agent should keep; more than it keeps is a failure.",
            "gauge",
            r.rules_wanted as u64,
        ),
        g(
            "devgate_agent_cluster_taints_overflow",
            "1 when the cluster put more taints on this node's GPUs than the gate's file holds.",
            "gauge",
            r.inward_overflow.is_some() as u64,
        ),
        g(
            "devgate_agent_bad_devices",
            "Devices devgate judges bad on this node.",
            "gauge",
            r.bad_devices as u64,
        ),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_are_prometheus_text() {
        let r = super::Report {
            api_ok: true,
            rules: 2,
            ..Default::default()
        };
        let m = super::metrics(&r);
        assert!(m.contains("# TYPE devgate_agent_api_up gauge\ndevgate_agent_api_up 1\n"));
        assert!(m.contains("devgate_agent_device_taint_rules 2\n"));
        assert!(m.contains("devgate_agent_cluster_taints_overflow 0\n"));
        assert!(m.contains("# TYPE devgate_agent_api_errors_total counter\n"));
    }
}
