//! The Node: the condition DevgateDeviceFault (True while devgate judges a device bad, as
//! node-problem-detector's conditions read), Events on device transitions, and, where the
//! operator asks, a NoSchedule taint once no healthy GPU is left on a node without DRA.

use crate::api::{Api, ApiResult};
use crate::verdicts::Bad;
use serde::Deserialize;
use serde_json::json;

pub const CONDITION: &str = "DevgateDeviceFault";
/// Kubernetes keeps a condition's message short in practice; tools show the first line.
const MAX_MESSAGE: usize = 4096;

#[derive(Debug, Deserialize)]
pub struct Node {
    pub metadata: crate::dra::Meta,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeSpec {
    #[serde(default)]
    pub taints: Vec<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub typ: String,
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: Option<String>,
}

/// The condition's status, reason and message for `bad`; `where_` names the DRA device
/// published for each, when there is one.
pub fn condition(
    bad: &[Bad],
    where_: impl Fn(&Bad) -> Option<String>,
) -> (&'static str, &'static str, String) {
    if bad.is_empty() {
        return (
            "False",
            "DevicesHealthy",
            "devgate judges every device on this node healthy".into(),
        );
    }
    let parts: Vec<String> = bad
        .iter()
        .map(|b| {
            let mut ids: Vec<String> = b.uuid.iter().cloned().collect();
            ids.extend(where_(b));
            let ids = if ids.is_empty() {
                String::new()
            } else {
                format!(" ({})", ids.join(", "))
            };
            format!("{}{ids}: {}", b.name, b.reason)
        })
        .collect();
    let mut msg = format!("{} unhealthy: {}", bad.len(), parts.join("; "));
    if msg.len() > MAX_MESSAGE {
        let cut = (0..=MAX_MESSAGE - 3)
            .rev()
            .find(|i| msg.is_char_boundary(*i))
            .unwrap_or(0);
        msg.truncate(cut);
        msg.push_str("...");
    }
    ("True", "DevicesUnhealthy", msg)
}

pub async fn get(api: &Api, node: &str) -> ApiResult<Node> {
    api.get(&format!("/api/v1/nodes/{node}")).await
}

/// Sets the condition when it differs from what the Node has.
pub async fn set_condition(
    api: &Api,
    n: &Node,
    c: (&str, &str, String),
    now: &str,
) -> ApiResult<bool> {
    let (status, reason, message) = c;
    let old = n.status.conditions.iter().find(|x| x.typ == CONDITION);
    if old.is_some_and(|o| o.status == status && o.message == message) {
        return Ok(false);
    }
    let transition = match old {
        Some(o) if o.status == status => o
            .last_transition_time
            .clone()
            .unwrap_or_else(|| now.to_string()),
        _ => now.to_string(),
    };
    let body = json!({"status": {"conditions": [{
        "type": CONDITION, "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": transition,
    }]}});
    api.patch(
        &format!("/api/v1/nodes/{}/status", n.metadata.name),
        &body,
        false,
    )
    .await?;
    Ok(true)
}

/// One Event on the Node.
pub async fn event(
    api: &Api,
    n: &Node,
    warning: bool,
    reason: &str,
    message: &str,
    now: &str,
) -> ApiResult<()> {
    let body = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{}.devgate-", n.metadata.name), "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": n.metadata.name, "uid": n.metadata.uid},
        "reason": reason, "message": message, "type": if warning { "Warning" } else { "Normal" },
        "source": {"component": "devgate-agent", "host": n.metadata.name},
        "reportingComponent": "devgate-agent", "reportingInstance": n.metadata.name,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    api.post("/api/v1/namespaces/default/events", &body).await
}

/// The node taint's value: what it says to whoever reads `kubectl describe node`.
const NODE_TAINT_VALUE: &str = "no-healthy-gpu";

/// Puts the node taint on (`on`) or takes it off; a taint of this key that the agent did
/// not put there (another value) is left alone. True when the Node changed.
pub async fn set_taint(api: &Api, n: &Node, key: &str, on: bool) -> ApiResult<bool> {
    let ours = |t: &serde_json::Value| t["key"] == key && t["value"] == NODE_TAINT_VALUE;
    let has = n.spec.taints.iter().any(ours);
    if has == on {
        return Ok(false);
    }
    let mut taints: Vec<serde_json::Value> =
        n.spec.taints.iter().filter(|t| !ours(t)).cloned().collect();
    if on {
        taints.push(json!({"key": key, "value": NODE_TAINT_VALUE, "effect": "NoSchedule"}));
    }
    // The resourceVersion makes this a compare-and-swap: a taint added meanwhile is kept.
    let body = json!({"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}});
    api.patch(&format!("/api/v1/nodes/{}", n.metadata.name), &body, true)
        .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(name: &str, reason: &str) -> Bad {
        Bad {
            key: format!("c {name}"),
            name: name.into(),
            class: devgate::model::class::Class::NvidiaGpu,
            code: devgate::model::verdict::Code::XidCritical,
            reason: reason.into(),
            uuid: Some("GPU-2".into()),
            pci_bus_id: None,
        }
    }

    #[test]
    fn the_condition_names_every_bad_device_with_its_reason() {
        let (s, r, m) = condition(&[], |_| None);
        assert_eq!((s, r), ("False", "DevicesHealthy"));
        assert!(!m.is_empty());
        let (s, r, m) = condition(
            &[
                bad("/dev/nvidia2", "xid: XID 79"),
                bad("/dev/nvidia5", "nvml: lost"),
            ],
            |b| (b.name == "/dev/nvidia2").then(|| "gpu.nvidia.com/n1/gpu-2".to_string()),
        );
        assert_eq!((s, r), ("True", "DevicesUnhealthy"));
        assert_eq!(m, "2 unhealthy: /dev/nvidia2 (GPU-2, gpu.nvidia.com/n1/gpu-2): xid: XID 79; /dev/nvidia5 (GPU-2): nvml: lost");
        let many: Vec<Bad> = (0..100)
            .map(|i| bad(&format!("/dev/nvidia{i}"), &"é".repeat(40)))
            .collect();
        let (_, _, m) = condition(&many, |_| None);
        assert!(m.len() <= MAX_MESSAGE && m.ends_with("..."));
    }
}
