//! What a probe says about a device: the vocabulary policy and records are written in.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "reason", rename_all = "snake_case")]
pub enum Verdict {
    Healthy,
    /// Usable, but worth an operator's look (a PCIe link trained below its maximum).
    Warn(String),
    Unhealthy(String),
    /// The probe could not tell; `policy.on_unknown` decides.
    Unknown(String),
    /// The probe has nothing to say about this kind of device.
    NotApplicable(String),
}

impl Verdict {
    pub fn status(&self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Warn(_) => "warn",
            Verdict::Unhealthy(_) => "unhealthy",
            Verdict::Unknown(_) => "unknown",
            Verdict::NotApplicable(_) => "not_applicable",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Healthy => None,
            Verdict::Warn(r)
            | Verdict::Unhealthy(r)
            | Verdict::Unknown(r)
            | Verdict::NotApplicable(r) => Some(r),
        }
    }

    /// The worst of several findings within one probe: unhealthy > unknown > warn > healthy.
    pub fn worst(findings: Vec<Verdict>) -> Verdict {
        let rank = |v: &Verdict| match v {
            Verdict::Unhealthy(_) => 4,
            Verdict::Unknown(_) => 3,
            Verdict::Warn(_) => 2,
            Verdict::Healthy => 1,
            Verdict::NotApplicable(_) => 0,
        };
        let top = findings.iter().map(rank).max().unwrap_or(1);
        let same: Vec<&Verdict> = findings.iter().filter(|v| rank(v) == top).collect();
        let joined = || {
            same.iter()
                .filter_map(|v| v.reason())
                .collect::<Vec<_>>()
                .join("; ")
        };
        match top {
            4 => Verdict::Unhealthy(joined()),
            3 => Verdict::Unknown(joined()),
            2 => Verdict::Warn(joined()),
            0 => Verdict::NotApplicable(joined()),
            _ => Verdict::Healthy,
        }
    }
}

/// One probe's verdict, written flat (`{"probe":…,"status":…,"reason":…}`). It is read back
/// through [`ProbeResultWire`]: serde's `flatten` buffers every field of the record into a
/// map of its own first, which made reading a record back cost more than writing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ProbeResultWire")]
pub struct ProbeResult {
    pub probe: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

#[derive(Deserialize)]
struct ProbeResultWire {
    probe: String,
    status: Status,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Healthy,
    Warn,
    Unhealthy,
    Unknown,
    NotApplicable,
}

impl TryFrom<ProbeResultWire> for ProbeResult {
    type Error = String;

    fn try_from(w: ProbeResultWire) -> Result<ProbeResult, String> {
        let reason = || {
            w.reason
                .clone()
                .ok_or_else(|| format!("probe {:?}: missing field `reason`", w.probe))
        };
        let verdict = match w.status {
            Status::Healthy => Verdict::Healthy,
            Status::Warn => Verdict::Warn(reason()?),
            Status::Unhealthy => Verdict::Unhealthy(reason()?),
            Status::Unknown => Verdict::Unknown(reason()?),
            Status::NotApplicable => Verdict::NotApplicable(reason()?),
        };
        Ok(ProbeResult {
            probe: w.probe,
            verdict,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_result_reads_back_what_it_wrote() {
        for v in [
            Verdict::Healthy,
            Verdict::Warn("w".into()),
            Verdict::Unhealthy("u".into()),
            Verdict::Unknown("k".into()),
            Verdict::NotApplicable("n".into()),
        ] {
            let r = ProbeResult {
                probe: "sysfs".into(),
                verdict: v,
            };
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(
                serde_json::from_str::<ProbeResult>(&text).unwrap(),
                r,
                "{text}"
            );
        }
        let err = serde_json::from_str::<ProbeResult>(r#"{"probe":"pcie","status":"warn"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("reason"), "{err}");
        assert!(
            serde_json::from_str::<ProbeResult>(r#"{"probe":"pcie","status":"fine"}"#).is_err()
        );
    }

    #[test]
    fn worst_picks_most_severe_and_joins_its_reasons() {
        let v = Verdict::worst(vec![
            Verdict::Warn("w".into()),
            Verdict::Unhealthy("a".into()),
            Verdict::Healthy,
            Verdict::Unhealthy("b".into()),
        ]);
        assert_eq!(v, Verdict::Unhealthy("a; b".into()));
        assert_eq!(Verdict::worst(vec![]), Verdict::Healthy);
        assert_eq!(
            Verdict::worst(vec![Verdict::Healthy, Verdict::Warn("x".into())]),
            Verdict::Warn("x".into())
        );
    }

    #[test]
    fn verdict_json_shape() {
        let r = ProbeResult {
            probe: "node".into(),
            verdict: Verdict::Unhealthy("gone".into()),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"probe":"node","status":"unhealthy","reason":"gone"}"#
        );
    }
}
