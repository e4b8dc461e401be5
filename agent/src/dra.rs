//! The DRA objects the agent reads and writes (resource.k8s.io v1 and v1beta2 share these
//! fields), typed to the fields it uses; everything else is left as the API server has it.

use devgate::model::clock::unix_of_rfc3339;
use devgate::store::cluster::{TimedToleration, MAX_STRING_CHARS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The prefix the API server completes into a name no one holds yet.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
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
    /// Set by the API server (RFC 3339); where a NoExecute toleration's seconds count from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

impl Taint {
    /// The same taint, as a rule's spec compares: the API server's `timeAdded` aside.
    pub fn same(&self, other: &Taint) -> bool {
        (&self.key, &self.value, &self.effect) == (&other.key, &other.value, &other.effect)
    }
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

/// The devices of `slices` on `node`. A device names a GPU (`uuid`, `pciBusID`) only when
/// its driver is `gpu_driver`: another driver's device that names a GPU is not that GPU,
/// and its taints are not the GPU's.
pub fn node_devices(slices: &[ResourceSlice], node: &str, gpu_driver: &str) -> Vec<NodeDevice> {
    let mut out = Vec::new();
    for s in slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
    {
        let gpu = s.spec.driver == gpu_driver;
        for d in &s.spec.devices {
            out.push(NodeDevice {
                driver: s.spec.driver.clone(),
                pool: s.spec.pool.name.clone(),
                device: d.name.clone(),
                uuid: d.attribute(&s.spec.driver, &["uuid"]).filter(|_| gpu),
                pci_bus_id: d
                    .attribute("resource.kubernetes.io", &["pciBusID"])
                    .or_else(|| d.attribute(&s.spec.driver, &["pciBusID"]))
                    .filter(|_| gpu),
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

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "devgate-agent");
pub const NODE_ANNOTATION: &str = "devgate.io/node";

/// Whether `r` is one of this node's agent's rules.
pub fn is_ours(r: &DeviceTaintRule, node: &str) -> bool {
    r.metadata.labels.get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
        && r.metadata
            .annotations
            .get(NODE_ANNOTATION)
            .map(String::as_str)
            == Some(node)
}

impl Selector {
    /// As the components that act on a rule match it (1.36 and 1.37: the eviction
    /// controller's `ruleMatchesDevice`, the scheduler's ResourceSlice tracker): every
    /// field set must equal, and a field not set matches every device, so the empty
    /// selector `{}` selects every device. Fields this agent does not know are ignored,
    /// which can only select more.
    pub fn selects(&self, d: &NodeDevice) -> bool {
        self.driver.as_ref().is_none_or(|v| *v == d.driver)
            && self.pool.as_ref().is_none_or(|v| *v == d.pool)
            && self.device.as_ref().is_none_or(|v| *v == d.device)
    }
}

impl RuleSpec {
    /// Whether the rule taints `d`. Without a selector the two components disagree: the
    /// scheduler's tracker applies the rule to every device (no allocation), the eviction
    /// controller to none (no eviction). The hook is a start, so it follows the scheduler.
    pub fn selects(&self, d: &NodeDevice) -> bool {
        self.device_selector.as_ref().is_none_or(|s| s.selects(d))
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
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: Option<String>,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub effect: String,
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

impl Toleration {
    /// As `resourceclaim.ToleratesTaint` reads it (1.36, 1.37): an empty effect matches
    /// every effect, an empty key every key; Equal (the default) needs the value.
    pub fn tolerates(&self, t: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != t.effect {
            return false;
        }
        if !self.key.is_empty() && self.key != t.key {
            return false;
        }
        match self.operator.as_deref().unwrap_or("Equal") {
            "" | "Equal" => self.value == t.value,
            "Exists" => true,
            _ => false,
        }
    }
}

/// How long one claim lets its pod stay on a tainted device, as the component that acts
/// on the taint decides. Ordered: the least of a pod's claims is what holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tolerated {
    No,
    /// Until these unix seconds (a NoExecute taint's `timeAdded` + `tolerationSeconds`).
    Until(u64),
    Forever,
}

/// How the claim's `tolerations` for one allocated device treat `t`. NoSchedule (and
/// None): as the scheduler, any tolerating toleration, for good. NoExecute: as the
/// eviction controller (`claimEvictionTime`), only tolerations whose effect is NoExecute
/// count; one without seconds is for good, else the least seconds from `timeAdded`
/// (negative as 0). No readable `timeAdded` with seconds: not tolerated.
pub fn tolerated(tolerations: &[Toleration], t: &Taint) -> Tolerated {
    if t.effect != "NoExecute" {
        let any = tolerations.iter().any(|tol| tol.tolerates(t));
        return if any {
            Tolerated::Forever
        } else {
            Tolerated::No
        };
    }
    let mut least: Option<i64> = None;
    for tol in tolerations
        .iter()
        .filter(|tol| tol.effect == "NoExecute" && tol.tolerates(t))
    {
        match tol.toleration_seconds {
            None => return Tolerated::Forever,
            Some(s) => least = Some(least.map_or(s.max(0), |l| l.min(s.max(0)))),
        }
    }
    let Some(secs) = least else {
        return Tolerated::No;
    };
    match t.time_added.as_deref().and_then(unix_of_rfc3339) {
        Some(added) => Tolerated::Until(added.saturating_add(secs as u64)),
        None => Tolerated::No,
    }
}

/// The pods whose claims hold `d` and tolerate `t`: for good, and for a time. Core Pods
/// only (another group's `pods` is not a Pod), and never a uid past the file's bound on a
/// string, which would make the hook's whole file unwritable. A pod with several claims
/// on `d` is tolerated as the least of them allows.
pub fn tolerating_pods(
    claims: &[ResourceClaim],
    d: &NodeDevice,
    t: &Taint,
) -> (Vec<String>, Vec<TimedToleration>) {
    let mut per_pod: BTreeMap<&str, Tolerated> = BTreeMap::new();
    for c in claims {
        let Some(st) = &c.status else { continue };
        let Some(devs) = st.allocation.as_ref().and_then(|a| a.devices.as_ref()) else {
            continue;
        };
        let held = (devs.results.iter())
            .filter(|r| r.driver == d.driver && r.pool == d.pool && r.device == d.device)
            .map(|r| tolerated(&r.tolerations, t))
            .min();
        let Some(how) = held else { continue };
        let pods = st.reserved_for.iter().filter(|r| {
            r.api_group.is_empty()
                && r.resource == "pods"
                && !r.uid.is_empty()
                && r.uid.len() <= MAX_STRING_CHARS
        });
        for p in pods {
            let e = per_pod.entry(&p.uid).or_insert(how);
            *e = (*e).min(how);
        }
    }
    let mut forever = Vec::new();
    let mut until = Vec::new();
    for (uid, how) in per_pod {
        match how {
            Tolerated::Forever => forever.push(uid.to_string()),
            Tolerated::Until(u) => until.push(TimedToleration {
                pod: uid.to_string(),
                until_unix: u,
            }),
            Tolerated::No => {}
        }
    }
    (forever, until)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(key: &str, op: Option<&str>, value: &str, effect: &str) -> Toleration {
        Toleration {
            key: key.into(),
            operator: op.map(String::from),
            value: value.into(),
            effect: effect.into(),
            toleration_seconds: None,
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
        let d = node_devices(&l.items, "n1", "gpu.nvidia.com");
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
    }

    /// The empty selector `{}` is every device, as the eviction controller and the
    /// scheduler read it (not "nothing", as upstream's docs once said); no selector is
    /// every device too, as the scheduler reads it.
    #[test]
    fn the_empty_selector_and_no_selector_select_every_device() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = node_devices(&l.items, "n1", "gpu.nvidia.com");
        let rule: DeviceTaintRule = serde_json::from_str(
            r#"{"metadata":{"name":"all"},"spec":{"deviceSelector":{},
              "taint":{"key":"k","effect":"NoExecute"}}}"#,
        )
        .unwrap();
        assert!(d.iter().all(|d| rule.spec.selects(d)));
        let bare: DeviceTaintRule = serde_json::from_str(
            r#"{"metadata":{"name":"bare"},"spec":{"taint":{"key":"k","effect":"NoSchedule"}}}"#,
        )
        .unwrap();
        assert!(d.iter().all(|d| bare.spec.selects(d)));
    }

    #[test]
    fn pods_whose_claims_tolerate() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = &node_devices(&l.items, "n1", "gpu.nvidia.com")[0];
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
            tolerating_pods(&claims.items, d, &t).0,
            vec!["uid-a".to_string()]
        );
        assert!(
            tolerating_pods(&claims.items, d, &taint("other", "", "NoSchedule"))
                .0
                .is_empty()
        );
    }

    #[test]
    fn only_core_pods_with_a_sane_uid_tolerate() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = &node_devices(&l.items, "n1", "gpu.nvidia.com")[0];
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
            tolerating_pods(&claims.items, d, &taint("k", "", "NoSchedule")).0,
            vec!["uid-r".to_string()]
        );
    }

    /// A device of another driver that names a GPU by `uuid` or `pciBusID` is not that
    /// GPU: only the GPU driver's devices carry a GPU's identity.
    #[test]
    fn only_the_gpu_drivers_devices_name_a_gpu() {
        let l: List<ResourceSlice> = serde_json::from_str(
            r#"{"items":[{"metadata":{"name":"evil"},"spec":{"driver":"evil.example.com",
              "pool":{"name":"n1"},"nodeName":"n1","devices":[{"name":"x","attributes":{
              "uuid":{"string":"GPU-a"},"resource.kubernetes.io/pciBusID":{"string":"0000:01:00.0"}},
              "taints":[{"key":"k","effect":"NoExecute"}]}]}}]}"#,
        )
        .unwrap();
        let d = node_devices(&l.items, "n1", "gpu.nvidia.com");
        assert_eq!((d[0].uuid.as_ref(), d[0].pci_bus_id.as_ref()), (None, None));
        let d = node_devices(&l.items, "n1", "evil.example.com");
        assert_eq!(
            d[0].uuid.as_deref(),
            Some("GPU-a"),
            "the flag names the driver"
        );
    }

    #[test]
    fn an_empty_key_tolerates_any_key_as_upstream() {
        let t = taint("example.com/maint", "swap", "NoSchedule");
        assert!(tol("", None, "swap", "").tolerates(&t));
        assert!(!tol("", None, "other", "").tolerates(&t));
    }

    /// As the eviction controller: for NoExecute only NoExecute tolerations count, the
    /// least seconds from the taint's timeAdded; none, or no seconds, for good.
    #[test]
    fn toleration_seconds_count_from_time_added() {
        let mut t = taint("k", "", "NoExecute");
        t.time_added = Some("2026-12-05T00:00:00Z".into());
        let added = unix_of_rfc3339("2026-12-05T00:00:00Z").unwrap();
        assert_eq!(added, 1_796_428_800);
        let secs = |s: Option<i64>, effect: &str| Toleration {
            toleration_seconds: s,
            ..tol("k", Some("Exists"), "", effect)
        };
        assert_eq!(
            tolerated(&[secs(None, "NoExecute")], &t),
            Tolerated::Forever
        );
        assert_eq!(
            tolerated(
                &[secs(Some(60), "NoExecute"), secs(Some(30), "NoExecute")],
                &t
            ),
            Tolerated::Until(added + 30)
        );
        assert_eq!(
            tolerated(&[secs(Some(-5), "NoExecute")], &t),
            Tolerated::Until(added)
        );
        assert_eq!(
            tolerated(&[secs(None, "")], &t),
            Tolerated::No,
            "no effect: evicted"
        );
        t.time_added = None;
        assert_eq!(tolerated(&[secs(Some(60), "NoExecute")], &t), Tolerated::No);
        // NoSchedule: the scheduler's reading, seconds or not
        let ns = taint("k", "", "NoSchedule");
        assert_eq!(tolerated(&[secs(Some(1), "")], &ns), Tolerated::Forever);
    }

    #[test]
    fn a_pod_tolerated_for_a_time_in_the_file() {
        let l: List<ResourceSlice> = serde_json::from_str(SLICE).unwrap();
        let d = &node_devices(&l.items, "n1", "gpu.nvidia.com")[0];
        let claims: List<ResourceClaim> = serde_json::from_str(
            r#"{"items":[
          {"status":{"allocation":{"devices":{"results":[
            {"driver":"gpu.nvidia.com","pool":"n1","device":"gpu-0",
             "tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":60}]}]}},
           "reservedFor":[{"resource":"pods","uid":"uid-a"}]}}]}"#,
        )
        .unwrap();
        let mut t = taint("k", "", "NoExecute");
        t.time_added = Some("1970-01-01T00:01:00Z".into());
        let (forever, until) = tolerating_pods(&claims.items, d, &t);
        assert!(forever.is_empty());
        assert_eq!(
            until,
            vec![TimedToleration {
                pod: "uid-a".into(),
                until_unix: 120
            }]
        );
    }
}
