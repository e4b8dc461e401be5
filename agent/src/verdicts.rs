//! devgate's verdicts on this node's devices, from `devgate status --json`: the devices it
//! judges bad, each with the words and code of its first unhealthy verdict. A verdict that
//! came from the cluster (a taint the agent itself wrote into the hook's file) is not
//! devgate's own, and is left out, so nothing the cluster says comes back as a fault.

use devgate::model::class::Class;
use devgate::model::verdict::{Code, ProbeResult, Verdict};
use serde::Deserialize;

/// The codes of the hook's cluster-taint probe.
const FROM_THE_CLUSTER: [Code; 2] = [Code::ClusterTaint, Code::ClusterTaintsUnreadable];
/// That probe's name: a code a newer devgate gives it reads back unspecified, and must not
/// come back as a fault of the device (the agent's own taint would then keep itself).
const CLUSTER_PROBE: &str = "cluster";

#[derive(Debug, Deserialize)]
struct Row {
    #[serde(rename = "type")]
    typ: String,
    major: u32,
    minor: u32,
    class: Class,
    #[serde(default)]
    host_path: Option<String>,
    #[serde(default, deserialize_with = "each_verdict")]
    verdicts: Vec<ProbeResult>,
    #[serde(default)]
    gpu: Option<Gpu>,
}

/// A row's verdicts, each read on its own: one this devgate cannot read (a newer devgate's
/// status, a record without its reason) is left out, but for an unhealthy one, which is
/// kept (its code unspecified): else one odd verdict would fail the whole status, and the
/// agent would publish nothing new for the node.
fn each_verdict<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ProbeResult>, D::Error> {
    let raw: Vec<serde_json::Value> = Deserialize::deserialize(d)?;
    Ok(raw
        .into_iter()
        .filter_map(|v| match ProbeResult::deserialize(&v) {
            Ok(r) => Some(r),
            Err(_) if v.get("status").and_then(|s| s.as_str()) == Some("unhealthy") => {
                let text = |k: &str| v.get(k).and_then(|s| s.as_str()).map(String::from);
                Some(ProbeResult {
                    probe: text("probe").unwrap_or_else(|| "devgate".into()),
                    verdict: Verdict::unhealthy(
                        Code::Unspecified,
                        text("reason").unwrap_or_else(|| "unhealthy".into()),
                    ),
                })
            }
            Err(_) => None,
        })
        .collect())
}

#[derive(Debug, Deserialize)]
struct Gpu {
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    pci_bus_id: Option<String>,
}

/// One device devgate judges bad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    /// `c 195:2`: stable across renames, the key transitions are told by.
    pub key: String,
    /// `/dev/nvidia2` (or the key, when devgate found no host node).
    pub name: String,
    pub class: Class,
    pub code: Code,
    /// The verdict's words, prefixed with the probe that spoke: `xid: XID 79 ...`.
    pub reason: String,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
}

/// One NVIDIA GPU of this node, as devgate names it (NVML, else the driver's list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
}

/// What the agent takes from one `devgate status --json`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// The devices devgate judges bad, in device order.
    pub bad: Vec<Bad>,
    /// How many NVIDIA GPUs devgate lists, healthy or not.
    pub gpus: usize,
    /// Those GPUs: the only devices whose cluster taints the hook's file carries.
    pub gpu_ids: Vec<NodeGpu>,
}

/// Reads devgate's status; Err when the text is not devgate's status.
pub fn read(status_json: &str) -> Result<Verdicts, String> {
    let rows: Vec<Row> = serde_json::from_str(status_json)
        .map_err(|e| format!("devgate status --json: unexpected output: {e}"))?;
    let mut bad: Vec<Bad> = rows.iter().filter_map(bad_row).collect();
    bad.sort_by(|a, b| a.key.cmp(&b.key));
    bad.dedup_by(|a, b| a.key == b.key);
    let gpus = rows.iter().filter(|r| r.class == Class::NvidiaGpu).count();
    let gpu_ids = (rows.iter())
        .filter(|r| r.class == Class::NvidiaGpu)
        .filter_map(|r| r.gpu.as_ref())
        .map(|g| NodeGpu {
            uuid: g.uuid.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
        })
        .collect();
    Ok(Verdicts { bad, gpus, gpu_ids })
}

fn bad_row(r: &Row) -> Option<Bad> {
    let (probe, why) = r.verdicts.iter().find_map(|v| match &v.verdict {
        Verdict::Unhealthy(why)
            if !FROM_THE_CLUSTER.contains(&why.code) && v.probe != CLUSTER_PROBE =>
        {
            Some((&v.probe, why))
        }
        _ => None,
    })?;
    let key = format!("{} {}:{}", r.typ, r.major, r.minor);
    Some(Bad {
        name: r.host_path.clone().unwrap_or_else(|| key.clone()),
        key,
        class: r.class.clone(),
        code: why.code,
        reason: devgate::model::text::one_line(&format!("{probe}: {}", why.detail)),
        uuid: r.gpu.as_ref().and_then(|g| g.uuid.clone()),
        pci_bus_id: r.gpu.as_ref().and_then(|g| g.pci_bus_id.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = r#"[
      {"type":"c","major":195,"minor":0,"class":"nvidia-gpu","host_path":"/dev/nvidia0",
       "roles":["accelerator"],"health":"healthy","verdicts":[{"probe":"node","status":"healthy"}],
       "gpu":{"minor":0,"uuid":"GPU-0","pci_bus_id":"00000000:01:00.0","checks":[]}},
      {"type":"c","major":195,"minor":2,"class":"nvidia-gpu","host_path":"/dev/nvidia2",
       "roles":["accelerator"],"health":"unhealthy","verdicts":[
         {"probe":"node","status":"healthy"},
         {"probe":"cluster","status":"unhealthy","code":"cluster_taint","reason":"tainted in the cluster"},
         {"probe":"xid","status":"unhealthy","code":"xid_critical","reason":"XID 79 (fallen off the bus)\n"}],
       "gpu":{"minor":2,"uuid":"GPU-2","pci_bus_id":"00000000:03:00.0","checks":[]}},
      {"type":"c","major":195,"minor":3,"class":"nvidia-gpu","host_path":"/dev/nvidia3",
       "roles":["accelerator"],"health":"unhealthy","verdicts":[
         {"probe":"cluster","status":"unhealthy","code":"cluster_taint","reason":"tainted"}],
       "gpu":{"minor":3,"uuid":"GPU-3","checks":[]}}
    ]"#;

    #[test]
    fn devgates_own_unhealthy_verdicts_only() {
        let Verdicts { bad, gpus, gpu_ids } = read(STATUS).unwrap();
        assert_eq!(gpu_ids.len(), 3);
        assert_eq!(gpu_ids[1].uuid.as_deref(), Some("GPU-2"));
        assert_eq!(bad.len(), 1, "{bad:?}");
        let b = &bad[0];
        assert_eq!(b.key, "c 195:2");
        assert_eq!(b.name, "/dev/nvidia2");
        assert_eq!(b.code, Code::XidCritical);
        assert_eq!(b.reason, "xid: XID 79 (fallen off the bus)\\x0a");
        assert_eq!(b.uuid.as_deref(), Some("GPU-2"));
        assert_eq!(b.class, Class::NvidiaGpu);
        assert_eq!(gpus, 3);
    }

    #[test]
    fn other_output_is_an_error() {
        assert!(read("no accelerators").is_err());
        assert!(read("{}").is_err());
        assert_eq!(read("[]").unwrap(), Verdicts::default());
    }

    /// A verdict a newer devgate writes in a way this one cannot read (a status it does not
    /// know, an unhealthy one without a reason) costs only that verdict: the other rows,
    /// and the row's other verdicts, still count; an unhealthy one still makes it bad.
    #[test]
    fn one_odd_verdict_does_not_lose_the_node() {
        let status = r#"[
          {"type":"c","major":195,"minor":0,"class":"nvidia-gpu","host_path":"/dev/nvidia0",
           "verdicts":[{"probe":"pcie","status":"degraded","code":"x","reason":"new"},
                       {"probe":"xid","status":"unhealthy","code":"xid_critical","reason":"XID 79"}],
           "gpu":{"uuid":"GPU-0"}},
          {"type":"c","major":195,"minor":1,"class":"nvidia-gpu","host_path":"/dev/nvidia1",
           "verdicts":[{"probe":"nvml","status":"unhealthy","code":"gpu_lost"}],
           "gpu":{"uuid":"GPU-1"}},
          {"type":"c","major":195,"minor":2,"class":"nvidia-gpu","verdicts":[42,
            {"probe":"cluster","status":"unhealthy","code":"cluster_taint_v2","reason":"t"}]}
        ]"#;
        let Verdicts { bad, gpus, .. } = read(status).unwrap();
        assert_eq!(gpus, 3);
        let keys: Vec<_> = bad.iter().map(|b| (b.key.as_str(), b.code)).collect();
        assert_eq!(
            keys,
            [
                ("c 195:0", Code::XidCritical),
                ("c 195:1", Code::Unspecified)
            ]
        );
        assert!(bad[1].reason.starts_with("nvml: "), "{}", bad[1].reason);
    }
}
