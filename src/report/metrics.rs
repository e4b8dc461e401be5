//! `devgate metrics`: the node inventory and the exit records as Prometheus text, for
//! node_exporter's textfile collector.

use crate::model::text::one_line;
use crate::model::verdict::Verdict;
use crate::report::inventory::{Health, Row};
use crate::report::record::ExitRecord;
use std::collections::BTreeMap;

/// The node agent's cluster taints file as metrics see it: its age, and whether that is
/// past `cluster_taints_max_age_s`. None where there is no readable file.
#[derive(Debug, Clone, Copy)]
pub struct TaintsAge {
    pub age_s: u64,
    pub stale: bool,
}

/// Prometheus text format for node_exporter's textfile collector: one gauge family after
/// another.
pub fn metrics_text(rows: &[Row], exits: &[ExitRecord], taints: Option<TaintsAge>) -> String {
    let mut families = vec![
        device_healthy(rows),
        device_health(rows),
        device_reasons(rows),
        device_quarantined(rows),
        spare_leased(rows),
        recent_faults(exits),
        exit_records(exits),
    ];
    if let Some(t) = taints {
        families.extend(taints_age(t));
    }
    families.iter().map(Family::text).collect()
}

fn taints_age(t: TaintsAge) -> [Family; 2] {
    [
        Family {
            name: "devgate_cluster_taints_age_seconds",
            help: "Seconds since devgate-agent last wrote the cluster taints file.",
            samples: vec![(String::new(), t.age_s)],
        },
        Family {
            name: "devgate_cluster_taints_stale",
            help: "1 when the cluster taints file is older than cluster_taints_max_age_s: \
                   every GPU's cluster verdict is then unknown.",
            samples: vec![(String::new(), u64::from(t.stale))],
        },
    ]
}

/// One gauge family: its name, its help line and its samples, each its labels (none: an
/// empty string) and its value.
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(String, u64)>,
}

impl Family {
    fn text(&self) -> String {
        let Family {
            name,
            help,
            samples,
        } = self;
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} gauge\n");
        for (labels, v) in samples {
            if labels.is_empty() {
                out.push_str(&format!("{name} {v}\n"));
            } else {
                out.push_str(&format!("{name}{{{labels}}} {v}\n"));
            }
        }
        out
    }
}

/// A label value: outside text escaped first (so a newline cannot end the sample), then
/// quoted as Prometheus's text format wants.
fn label(s: &str) -> String {
    one_line(s)
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn dev_labels(r: &Row) -> String {
    format!(
        "device=\"{}\",class=\"{}\",major_minor=\"{}\"",
        label(&r.device.name()),
        label(r.device.class.as_str()),
        r.device.num
    )
}

fn device_healthy(rows: &[Row]) -> Family {
    Family {
        name: "devgate_device_healthy",
        help: "1 when no probe finds the device unhealthy or unknown.",
        samples: rows
            .iter()
            .map(|r| (dev_labels(r), u64::from(r.health <= Health::Degraded)))
            .collect(),
    }
}

fn device_health(rows: &[Row]) -> Family {
    let states = [
        Health::Healthy,
        Health::Degraded,
        Health::Unknown,
        Health::Unhealthy,
    ];
    Family {
        name: "devgate_device_health",
        help: "The device's health, one series per state with value 1 for the current one.",
        samples: rows
            .iter()
            .flat_map(|r| {
                states.into_iter().map(move |h| {
                    (
                        format!("{},health=\"{}\"", dev_labels(r), h.as_str()),
                        u64::from(r.health == h),
                    )
                })
            })
            .collect(),
    }
}

/// One series per probe with a finding (warn, unknown, unhealthy) on a device: its status
/// and its reason code, value 1. A device without findings has none; the code is stable,
/// so an alert or a dashboard groups by it without reading the reason's words.
fn device_reasons(rows: &[Row]) -> Family {
    Family {
        name: "devgate_device_reason",
        help: "1 for each probe finding on the device, by probe, status and reason code.",
        samples: rows
            .iter()
            .flat_map(|r| {
                r.verdicts
                    .iter()
                    .filter(|v| !matches!(v.verdict, Verdict::Healthy | Verdict::NotApplicable(_)))
                    .filter_map(move |v| {
                        let code = v.verdict.code()?;
                        let labels = format!(
                            "{},probe=\"{}\",status=\"{}\",code=\"{code}\"",
                            dev_labels(r),
                            label(&v.probe),
                            v.verdict.status()
                        );
                        Some((labels, 1))
                    })
            })
            .collect(),
    }
}

fn device_quarantined(rows: &[Row]) -> Family {
    Family {
        name: "devgate_device_quarantined",
        help: "1 when an operator cordoned the device.",
        samples: rows
            .iter()
            .map(|r| (dev_labels(r), u64::from(r.quarantine.is_some())))
            .collect(),
    }
}

fn spare_leased(rows: &[Row]) -> Family {
    Family {
        name: "devgate_spare_leased",
        help: "1 when a spare is leased to a container.",
        samples: rows
            .iter()
            .filter(|r| r.roles.contains(&"spare"))
            .map(|r| (dev_labels(r), u64::from(r.lease.is_some())))
            .collect(),
    }
}

fn recent_faults(exits: &[ExitRecord]) -> Family {
    let mut by_code: BTreeMap<&str, u64> = BTreeMap::new();
    for f in exits.iter().flat_map(|x| &x.faults) {
        *by_code.entry(&f.code).or_default() += 1;
    }
    Family {
        name: "devgate_recent_faults",
        help: "Device faults in the exit records devgate keeps, by code.",
        samples: by_code
            .into_iter()
            .map(|(c, n)| (format!("code=\"{}\"", label(c)), n))
            .collect(),
    }
}

fn exit_records(exits: &[ExitRecord]) -> Family {
    Family {
        name: "devgate_exit_records",
        help: "Exit records kept under state_dir/exits.",
        samples: vec![(String::new(), exits.len() as u64)],
    }
}
