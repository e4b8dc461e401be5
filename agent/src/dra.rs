//! The DRA objects the agent reads and writes (resource.k8s.io v1 and v1beta2 share these
//! fields), typed to the fields it uses; everything else is left as the API server has it.

use devgate::store::cluster::MAX_STRING_CHARS;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct List<T> {
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    pub effect: String,
}

// ---- ResourceSlice --------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub struct ResourceSlice {
    pub metadata: Meta,
    pub spec: SliceSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    pub driver: String,
    pub pool: Pool,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

#[derive(Debug, Deserialize)]
pub struct Pool {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct SliceDevice {
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
    #[serde(default)]
    pub taints: Vec<Taint>,
}

#[derive(Debug, Deserialize)]
pub struct Attribute {
    #[serde(default)]
    pub string: Option<String>,
}

/// One device a DRA driver publishes on this node, with what identifies the GPU behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    /// The driver's own taints, and the slice that carries them.
    pub taints: Vec<Taint>,
    pub slice: String,
}

impl SliceDevice {
    /// An attribute by its name, unqualified (the driver's own domain) or qualified.
    fn attribute(&self, driver: &str, names: &[&str]) -> Option<String> {
        names.iter().find_map(|n| {
            let qualified = format!("{driver}/{n}");
            self.attributes
                .get(*n)
                .or_else(|| self.attributes.get(&qualified))
                .and_then(|a| a.string.clone())
        })
    }
}

/// The devices of `slices` on `node`.
pub fn node_devices(slices: &[ResourceSlice], node: &str) -> Vec<NodeDevice> {
    let mut out = Vec::new();
    for s in slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
    {
        for d in &s.spec.devices {
            out.push(NodeDevice {
                driver: s.spec.driver.clone(),
                pool: s.spec.pool.name.clone(),
                device: d.name.clone(),
                uuid: d.attribute(&s.spec.driver, &["uuid"]),
                pci_bus_id: d
                    .attribute("resource.kubernetes.io", &["pciBusID"])
                    .or_else(|| d.attribute(&s.spec.driver, &["pciBusID"])),
                taints: d.taints.clone(),
                slice: s.metadata.name.clone(),
            });
        }
    }
    out
}

// ---- DeviceTaintRule ------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaintRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub metadata: Meta,
    pub spec: RuleSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<Selector>,
    pub taint: Taint,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

impl Selector {
    /// As the API server matches it: every field set must equal; an absent selector (or one
    /// with no field) selects nothing (KEP-5055 since 1.35).
    pub fn selects(&self, d: &NodeDevice) -> bool {
        let set = [&self.driver, &self.pool, &self.device];
        if set.iter().all(|f| f.is_none()) {
            return false;
        }
        self.driver.as_ref().is_none_or(|v| *v == d.driver)
            && self.pool.as_ref().is_none_or(|v| *v == d.pool)
            && self.device.as_ref().is_none_or(|v| *v == d.device)
    }
}

// ---- ResourceClaim --------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub struct ResourceClaim {
    #[serde(default)]
    pub status: Option<ClaimStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    #[serde(default)]
    pub allocation: Option<Allocation>,
    #[serde(default)]
    pub reserved_for: Vec<Consumer>,
}

#[derive(Debug, Deserialize)]
pub struct Allocation {
    #[serde(default)]
    pub devices: Option<DeviceAllocation>,
}

#[derive(Debug, Deserialize)]
pub struct DeviceAllocation {
    #[serde(default)]
    pub results: Vec<AllocationResult>,
}

#[derive(Debug, Deserialize)]
pub struct AllocationResult {
    pub driver: String,
    pub pool: String,
    pub device: String,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    /// Empty for the core group: only `pods` there is a Pod.
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Toleration {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: Option<String>,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub effect: String,
}

impl Toleration {
    /// As the scheduler's device taint matching reads it (KEP-5055, the same rules as pod
    /// tolerations): an empty key with Exists tolerates every taint; an empty effect every
    /// effect; Equal (the default) needs the value.
    pub fn tolerates(&self, t: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != t.effect {
            return false;
        }
        match self.operator.as_deref().unwrap_or("Equal") {
            "Exists" => self.key.is_empty() || self.key == t.key,
            "Equal" => self.key == t.key && self.value == t.value,
            _ => false,
        }
    }
}

/// The uids of the pods whose claims hold `d` and tolerate `t`: core Pods only (another
/// group's `pods` is not a Pod), and never a uid past the file's bound on a string, which
/// would make the hook's whole file unwritable.
pub fn tolerating_pods(claims: &[ResourceClaim], d: &NodeDevice, t: &Taint) -> Vec<String> {
    let mut uids = Vec::new();
    for c in claims {
        let Some(st) = &c.status else { continue };
        let Some(devs) = st.allocation.as_ref().and_then(|a| a.devices.as_ref()) else {
            continue;
        };
        let holds = devs.results.iter().any(|r| {
            r.driver == d.driver
                && r.pool == d.pool
                && r.device == d.device
                && r.tolerations.iter().any(|tol| tol.tolerates(t))
        });
        if holds {
            uids.extend(
                st.reserved_for
                    .iter()
                    .filter(|r| {
                        r.api_group.is_empty()
                            && r.resource == "pods"
                            && !r.uid.is_empty()
                            && r.uid.len() <= MAX_STRING_CHARS
                    })
                    .map(|r| r.uid.clone()),
            );
        }
    }
    uids.sort();
    uids.dedup();
    uids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        }
    }

    fn tol(key: &str, op: Option<&str>, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: key.into(),
            operator: op.map(String::from),
            value: value.into(),
            effect: effect.into(),
        }
    }

    #[test]
    fn tolerations_match_as_the_scheduler_does() {
        let t = taint("example.com/maint", "swap", "NoSchedule");
        assert!(tol("", Some("Exists"), "", "").tolerates(&t));
        assert!(tol("example.com/maint", Some("Exists"), "", "NoSchedule").tolerates(&t));
        assert!(tol("example.com/maint", None, "swap", "").tolerates(&t));
        assert!(!tol("example.com/maint", None, "other", "").tolerates(&t));
        assert!(!tol("example.com/maint", Some("Exists"), "", "NoExecute").tolerates(&t));
        assert!(!tol("other", Some("Exists"), "", "").tolerates(&t));
        assert!(!tol("example.com/maint", Some("Lt"), "swap", "").tolerates(&t));
    }

    const SLICE: &str = r#"{"items":[{"metadata":{"name":"n1-gpu.nvidia.com-abc"},
      "spec":{"driver":"gpu.nvidia.com","pool":{"name":"n1","generation":1,"resourceSliceCount":1},
      "nodeName":"n1","devices":[
        {"name":"gpu-0","attributes":{"uuid":{"string":"GPU-a"},
          "resource.kubernetes.io/pciBusID":{"string":"0000:01:00.0"},"index":{"int":0}}},
        {"name":"gpu-1","attributes":{"gpu.nvidia.com/uuid":{"string":"GPU-b"}},
          "taints":[{"key":"gpu.nvidia.com/xid","value":"79","effect":"NoSchedule","timeAdded":"2026-12-05T00:00:00Z"}]}]}},
      {"metadata":{"name":"other"},"spec":{"driver":"d","pool":{"name":"n2"},"nodeName":"n2","devices":[{"name":"x"}]}}]}"#;

    #[test]
    fn a_nodes_devices_with_their_gpu_and_taints() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = node_devices(&l.items, "n1");
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].uuid.as_deref(), Some("GPU-a"));
        assert_eq!(d[0].pci_bus_id.as_deref(), Some("0000:01:00.0"));
        assert_eq!(d[1].uuid.as_deref(), Some("GPU-b"));
        assert_eq!(d[1].taints[0].value, "79");
        let sel = |dr: Option<&str>, p: Option<&str>, dev: Option<&str>| Selector {
            driver: dr.map(String::from),
            pool: p.map(String::from),
            device: dev.map(String::from),
        };
        assert!(sel(Some("gpu.nvidia.com"), Some("n1"), Some("gpu-1")).selects(&d[1]));
        assert!(!sel(Some("gpu.nvidia.com"), Some("n1"), Some("gpu-1")).selects(&d[0]));
        assert!(sel(None, Some("n1"), None).selects(&d[0]));
        assert!(!sel(None, None, None).selects(&d[0]));
    }

    #[test]
    fn pods_whose_claims_tolerate() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = &node_devices(&l.items, "n1")[0];
        let claims: List<ResourceClaim> = serde_json::from_str(
            r#"{"items":[
          {"metadata":{"name":"a","namespace":"x"},"status":{"allocation":{"devices":{"results":[
            {"request":"r","driver":"gpu.nvidia.com","pool":"n1","device":"gpu-0",
             "tolerations":[{"key":"k","operator":"Exists"}]}]}},
           "reservedFor":[{"resource":"pods","name":"p","uid":"uid-a"}]}},
          {"metadata":{"name":"b","namespace":"x"},"status":{"allocation":{"devices":{"results":[
            {"request":"r","driver":"gpu.nvidia.com","pool":"n1","device":"gpu-0"}]}},
           "reservedFor":[{"resource":"pods","name":"q","uid":"uid-b"}]}},
          {"metadata":{"name":"c","namespace":"x"}}]}"#,
        )
        .unwrap();
        let t = taint("k", "", "NoSchedule");
        assert_eq!(
            tolerating_pods(&claims.items, d, &t),
            vec!["uid-a".to_string()]
        );
        assert!(tolerating_pods(&claims.items, d, &taint("other", "", "NoSchedule")).is_empty());
    }

    #[test]
    fn only_core_pods_with_a_sane_uid_tolerate() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = &node_devices(&l.items, "n1")[0];
        let long = "u".repeat(devgate::store::cluster::MAX_STRING_CHARS + 1);
        let claims: List<ResourceClaim> = serde_json::from_str(&format!(
            r#"{{"items":[
          {{"status":{{"allocation":{{"devices":{{"results":[
            {{"driver":"gpu.nvidia.com","pool":"n1","device":"gpu-0",
             "tolerations":[{{"operator":"Exists"}}]}}]}}}},
           "reservedFor":[
             {{"apiGroup":"example.com","resource":"pods","name":"p","uid":"not-a-pod"}},
             {{"resource":"pods","name":"q","uid":"{long}"}},
             {{"apiGroup":"","resource":"pods","name":"r","uid":"uid-r"}}]}}}}]}}"#
        ))
        .unwrap();
        assert_eq!(
            tolerating_pods(&claims.items, d, &taint("k", "", "NoSchedule")),
            vec!["uid-r".to_string()]
        );
    }
}
