//! What a probe says about a device: the vocabulary policy and records are written in.
//! Every verdict but healthy carries a typed [`Reason`]: its code for tools, its detail
//! for people, rendered to text only where devgate prints or writes it.

pub use super::reason::{Code, Reason};
use serde::{Deserialize, Serialize, Serializer};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Usable, but worth an operator's look (a PCIe link trained below its maximum).
    Warn(Reason),
    Unhealthy(Reason),
    /// The probe could not tell; `policy.on_unknown` decides.
    Unknown(Reason),
    /// The probe has nothing to say about this kind of device.
    NotApplicable(Reason),
}

impl Verdict {
    pub fn warn(code: Code, detail: impl Into<String>) -> Verdict {
        Verdict::Warn(Reason::new(code, detail))
    }

    pub fn unhealthy(code: Code, detail: impl Into<String>) -> Verdict {
        Verdict::Unhealthy(Reason::new(code, detail))
    }

    pub fn unknown(code: Code, detail: impl Into<String>) -> Verdict {
        Verdict::Unknown(Reason::new(code, detail))
    }

    pub fn not_applicable(code: Code, detail: impl Into<String>) -> Verdict {
        Verdict::NotApplicable(Reason::new(code, detail))
    }

    pub fn status(&self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Warn(_) => "warn",
            Verdict::Unhealthy(_) => "unhealthy",
            Verdict::Unknown(_) => "unknown",
            Verdict::NotApplicable(_) => "not_applicable",
        }
    }

    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Verdict::Healthy => None,
            Verdict::Warn(r)
            | Verdict::Unhealthy(r)
            | Verdict::Unknown(r)
            | Verdict::NotApplicable(r) => Some(r),
        }
    }

    pub fn code(&self) -> Option<Code> {
        self.reason().map(|r| r.code)
    }

    /// The reason as a person reads it.
    pub fn detail(&self) -> Option<&str> {
        self.reason().map(|r| r.detail.as_str())
    }

    /// The same verdict with `prefix` before its detail (`pcie: `, `xid: `), so that a
    /// reject line says which check spoke; the code stays.
    pub fn prefixed(self, prefix: &str) -> Verdict {
        let with = |r: Reason| Reason::new(r.code, format!("{prefix}{}", r.detail));
        match self {
            Verdict::Healthy => Verdict::Healthy,
            Verdict::Warn(r) => Verdict::Warn(with(r)),
            Verdict::Unhealthy(r) => Verdict::Unhealthy(with(r)),
            Verdict::Unknown(r) => Verdict::Unknown(with(r)),
            Verdict::NotApplicable(r) => Verdict::NotApplicable(with(r)),
        }
    }

    /// unhealthy > unknown > warn > healthy > not applicable.
    fn rank(&self) -> u8 {
        match self {
            Verdict::Unhealthy(_) => 4,
            Verdict::Unknown(_) => 3,
            Verdict::Warn(_) => 2,
            Verdict::Healthy => 1,
            Verdict::NotApplicable(_) => 0,
        }
    }

    /// The worst of several findings within one probe: unhealthy > unknown > warn >
    /// healthy. Its code is the first of the worst findings'; its detail joins theirs.
    pub fn worst(findings: Vec<Verdict>) -> Verdict {
        let top = findings.iter().map(Verdict::rank).max().unwrap_or(1);
        let mut same = findings
            .into_iter()
            .filter(|v| v.rank() == top)
            .filter_map(|v| v.reason().cloned());
        let Some(mut reason) = same.next() else {
            return Verdict::Healthy;
        };
        for r in same {
            reason.detail.push_str("; ");
            reason.detail.push_str(&r.detail);
        }
        match top {
            4 => Verdict::Unhealthy(reason),
            3 => Verdict::Unknown(reason),
            2 => Verdict::Warn(reason),
            _ => Verdict::NotApplicable(reason),
        }
    }
}

/// Written flat beside whatever holds it: `"status":…` and, but for a healthy verdict,
/// `"code":…,"reason":…`.
impl Serialize for Verdict {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Wire<'a> {
            status: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            code: Option<Code>,
            #[serde(skip_serializing_if = "Option::is_none")]
            reason: Option<&'a str>,
        }
        Wire {
            status: self.status(),
            code: self.code(),
            reason: self.detail(),
        }
        .serialize(s)
    }
}

/// One probe's verdict, written flat (`{"probe":…,"status":…,"code":…,"reason":…}`). It is
/// read back through [`ProbeResultWire`]: serde's `flatten` buffers every field of the
/// record into a map of its own first, which made reading a record back cost more than
/// writing it.
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
    /// Absent from a record an older devgate wrote: unspecified.
    #[serde(default)]
    code: Code,
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

/// A probe result read back whose status needs a reason and has none. serde takes its text
/// (it needs only `Display`) into the error of the record being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingReason {
    pub probe: String,
}

impl std::fmt::Display for MissingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "probe {:?}: missing field `reason`", self.probe)
    }
}

impl std::error::Error for MissingReason {}

impl TryFrom<ProbeResultWire> for ProbeResult {
    type Error = MissingReason;

    fn try_from(w: ProbeResultWire) -> Result<ProbeResult, MissingReason> {
        let ProbeResultWire {
            probe,
            status,
            code,
            reason,
        } = w;
        let with: fn(Reason) -> Verdict = match status {
            Status::Healthy => {
                let verdict = Verdict::Healthy;
                return Ok(ProbeResult { probe, verdict });
            }
            Status::Warn => Verdict::Warn,
            Status::Unhealthy => Verdict::Unhealthy,
            Status::Unknown => Verdict::Unknown,
            Status::NotApplicable => Verdict::NotApplicable,
        };
        let Some(detail) = reason else {
            return Err(MissingReason { probe });
        };
        let verdict = with(Reason::new(code, detail));
        Ok(ProbeResult { probe, verdict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_result_reads_back_what_it_wrote() {
        for v in [
            Verdict::Healthy,
            Verdict::warn(Code::PcieReplay, "w"),
            Verdict::unhealthy(Code::GpuLost, "u"),
            Verdict::unknown(Code::NvmlUnanswered, "k"),
            Verdict::not_applicable(Code::NotNvidiaGpu, "n"),
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
        assert!(
            err.starts_with("probe \"pcie\": missing field `reason`"),
            "{err}"
        );
        assert!(
            serde_json::from_str::<ProbeResult>(r#"{"probe":"pcie","status":"fine"}"#).is_err()
        );
    }

    /// Records an older devgate wrote (no `code`) and a newer one's (a code this one does
    /// not know) still read: the reason is kept, its code unspecified.
    #[test]
    fn records_without_a_code_or_with_a_newer_one_still_read() {
        let read = |s: &str| serde_json::from_str::<ProbeResult>(s).unwrap().verdict;
        let old = read(r#"{"probe":"node","status":"unhealthy","reason":"gone"}"#);
        assert_eq!(old, Verdict::unhealthy(Code::Unspecified, "gone"));
        let newer =
            read(r#"{"probe":"node","status":"warn","code":"node_on_fire","reason":"hot"}"#);
        assert_eq!(newer, Verdict::warn(Code::Unspecified, "hot"));
        let healthy = read(r#"{"probe":"xid","status":"healthy","reason":null}"#);
        assert_eq!(healthy, Verdict::Healthy);
    }

    #[test]
    fn worst_picks_most_severe_keeps_its_first_code_and_joins_its_reasons() {
        let v = Verdict::worst(vec![
            Verdict::warn(Code::Throttled, "w"),
            Verdict::unhealthy(Code::RowRemapFailed, "a"),
            Verdict::Healthy,
            Verdict::unhealthy(Code::EccVolatileUncorrectable, "b"),
        ]);
        assert_eq!(v, Verdict::unhealthy(Code::RowRemapFailed, "a; b"));
        assert_eq!(Verdict::worst(vec![]), Verdict::Healthy);
        assert_eq!(
            Verdict::worst(vec![Verdict::Healthy, Verdict::warn(Code::Throttled, "x")]),
            Verdict::warn(Code::Throttled, "x")
        );
        assert_eq!(
            Verdict::worst(vec![
                Verdict::not_applicable(Code::NotReported, "p"),
                Verdict::not_applicable(Code::NoPciFunction, "q"),
            ]),
            Verdict::not_applicable(Code::NotReported, "p; q")
        );
    }

    #[test]
    fn prefixed_keeps_the_code() {
        let v = Verdict::warn(Code::AerCorrectable, "PCIe AER: 1 error").prefixed("pcie: ");
        assert_eq!(v.code(), Some(Code::AerCorrectable));
        assert_eq!(v.detail(), Some("pcie: PCIe AER: 1 error"));
        assert_eq!(Verdict::Healthy.prefixed("pcie: "), Verdict::Healthy);
    }

    #[test]
    fn verdict_json_shape() {
        let r = ProbeResult {
            probe: "node".into(),
            verdict: Verdict::unhealthy(Code::NodeMissing, "gone"),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"probe":"node","status":"unhealthy","code":"node_missing","reason":"gone"}"#
        );
        let r = ProbeResult {
            probe: "node".into(),
            verdict: Verdict::Healthy,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"probe":"node","status":"healthy"}"#
        );
    }
}
