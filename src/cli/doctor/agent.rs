//! The node agent (`devgate-agent`, issue #30) as doctor sees it: its status file under
//! state_dir. No file is a note (no cluster integration on this node); a fresh one whose
//! API calls succeed passes; a stale one, or one whose API calls fail, warns with the
//! agent's last error.

use super::line::Line;
use crate::error::Result;
use crate::store::cluster::{self, AgentStatus, ClusterTaints};

/// Past this many seconds without an update the agent is taken for stopped or stuck.
pub(crate) const STALE_AFTER_S: u64 = 60;

/// The most characters of the agent's last error doctor shows.
const MAX_ERROR_CHARS: usize = 512;

const CHECK: &str = "devgate-agent";

/// The agent's line, from its status file under `state_dir`.
pub(crate) fn agent_check(state_dir: &std::path::Path) -> Line {
    judge(
        &cluster::read_status(state_dir),
        crate::model::clock::now().0,
    )
}

const TAINTS_CHECK: &str = "cluster taints";

/// The cluster taints file's line: none where there is no file; a warning where it is
/// unreadable or older than `max_age_s` (every GPU's cluster verdict is then unknown).
pub(crate) fn taints_check(state_dir: &std::path::Path, max_age_s: u64) -> Option<Line> {
    judge_taints(
        &cluster::read(state_dir),
        max_age_s,
        crate::model::clock::now_unix(),
    )
}

/// The line for what the taints file held at `now`. Pure.
pub(crate) fn judge_taints(
    file: &Result<Option<ClusterTaints>>,
    max_age_s: u64,
    now: u64,
) -> Option<Line> {
    let t = match file {
        Ok(None) => return None,
        Err(e) => {
            return Some(Line::warn(
                TAINTS_CHECK,
                format!("unreadable, so every GPU's cluster verdict is unknown: {e}"),
            ))
        }
        Ok(Some(t)) => t,
    };
    Some(match t.stale_age(now, max_age_s) {
        Some(age) => Line::warn(
            TAINTS_CHECK,
            format!(
                "written {age} s ago, more than cluster_taints_max_age_s {max_age_s}: every \
                 GPU's cluster verdict is unknown (policy.on_unknown) until devgate-agent \
                 writes it again"
            ),
        ),
        None => Line::pass(
            TAINTS_CHECK,
            format!(
                "{} taints, written {} s ago (stale after {max_age_s} s)",
                t.taints.len(),
                now.saturating_sub(t.written_unix)
            ),
        ),
    })
}

/// The line for what the status file held at `now`. Pure.
pub(crate) fn judge(status: &Result<Option<AgentStatus>>, now: u64) -> Line {
    let s = match status {
        Ok(None) => {
            return Line::note(
                CHECK,
                "devgate-agent not running on this node: no cluster integration",
            )
        }
        Err(e) => return Line::warn(CHECK, format!("status unreadable: {e}")),
        Ok(Some(s)) => s,
    };
    let age = now.saturating_sub(s.updated_unix);
    let last_error = || match &s.last_error {
        Some(e) => {
            let cut: String = e.chars().take(MAX_ERROR_CHARS).collect();
            format!("last error: {cut}")
        }
        None => "no error given".into(),
    };
    if age > STALE_AFTER_S {
        return Line::warn(
            CHECK,
            format!(
                "status not updated for {age} s (pid {}): stopped or stuck; {}",
                s.pid,
                last_error()
            ),
        );
    }
    if !s.api_ok {
        return Line::warn(
            CHECK,
            format!("cannot reach the Kubernetes API; {}", last_error()),
        );
    }
    if let Some(line) = not_in_step(s, &last_error()) {
        return line;
    }
    Line::pass(
        CHECK,
        format!(
            "running (pid {}), updated {age} s ago; {}; {} rules, {} cluster taints, {} bad devices",
            s.pid,
            s.dra_api.as_deref().unwrap_or("no DRA API"),
            s.rules,
            s.inward_taints,
            s.bad_devices
        ),
    )
}

/// A warning when the agent is up but does not do its whole job: the cluster's taints
/// overflowed the hook's file, or it holds fewer rules than it should (issue #36).
fn not_in_step(s: &AgentStatus, last_error: &str) -> Option<Line> {
    if let Some(why) = &s.inward_overflow {
        let cut: String = why.chars().take(MAX_ERROR_CHARS).collect();
        return Some(Line::warn(
            CHECK,
            format!(
                "cluster taints overflowed ({}): every GPU's cluster taints are unknown",
                crate::model::text::one_line(&cut)
            ),
        ));
    }
    if s.rules < s.rules_wanted {
        return Some(Line::warn(
            CHECK,
            format!(
                "holds {} of the {} DeviceTaintRules it should; {}",
                s.rules, s.rules_wanted, last_error
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::line::Mark;
    use super::*;

    fn status(updated: u64, api_ok: bool, err: Option<&str>) -> AgentStatus {
        AgentStatus {
            node: "node-1".into(),
            pid: 42,
            updated_unix: updated,
            api_ok,
            last_error: err.map(String::from),
            dra_api: Some("resource.k8s.io/v1".into()),
            rules: 1,
            ..AgentStatus::default()
        }
    }

    #[test]
    fn absent_fresh_stale_and_failing() {
        let l = judge(&Ok(None), 1000);
        assert_eq!(l.mark, Mark::Note);
        assert!(l
            .text
            .contains("not running on this node: no cluster integration"));
        let l = judge(&Ok(Some(status(990, true, None))), 1000);
        assert_eq!(l.mark, Mark::Pass, "{l:?}");
        assert!(l.text.contains("resource.k8s.io/v1; 1 rules"), "{}", l.text);
        let l = judge(&Ok(Some(status(1000 - 61, true, None))), 1000);
        assert_eq!(l.mark, Mark::Warn);
        assert!(l.text.contains("not updated for 61 s"), "{}", l.text);
        let l = judge(&Ok(Some(status(999, false, Some("forbidden")))), 1000);
        assert_eq!(l.mark, Mark::Warn);
        assert!(l.text.ends_with("last error: forbidden"), "{}", l.text);
        assert!(l.render().starts_with("⚠ devgate-agent: "));
    }

    #[test]
    fn the_taints_file_is_judged_by_its_age() {
        let file = |written| {
            Ok(Some(ClusterTaints {
                node: "node-1".into(),
                written_unix: written,
                taints: Vec::new(),
                overflow: None,
            }))
        };
        assert!(judge_taints(&Ok(None), 300, 1000).is_none());
        let l = judge_taints(&file(800), 300, 1000).unwrap();
        assert_eq!(l.mark, Mark::Pass, "{l:?}");
        assert!(l.text.contains("written 200 s ago"), "{}", l.text);
        let l = judge_taints(&file(699), 300, 1000).unwrap();
        assert_eq!(l.mark, Mark::Warn, "{l:?}");
        assert!(
            l.text.starts_with("written 301 s ago, more than"),
            "{}",
            l.text
        );
        // written in the future (the clock stepped back): fresh
        let l = judge_taints(&file(5000), 300, 1000).unwrap();
        assert_eq!(l.mark, Mark::Pass, "{l:?}");
    }

    /// The agent's last error may hold an API server's text: escaped, and cut.
    #[test]
    fn the_last_error_is_escaped_and_bounded() {
        let hostile = format!("a\n✓ devgate-agent: fine\x1b[2J{}", "x".repeat(10_000));
        let l = judge(&Ok(Some(status(999, false, Some(&hostile)))), 1000);
        let r = l.render();
        assert!(!r.contains('\n') && !r.contains('\x1b'), "{r}");
        assert!(r.len() < 700, "{}", r.len());
    }

    /// A rule the agent cannot hold, or taints past the file's bounds, is a warning.
    #[test]
    fn rules_not_held_and_an_overflow_warn() {
        let mut s = status(999, true, None);
        s.rules_wanted = 2;
        let l = judge(&Ok(Some(s.clone())), 1000);
        assert_eq!(l.mark, Mark::Warn);
        assert!(
            l.text.contains("holds 1 of the 2 DeviceTaintRules"),
            "{}",
            l.text
        );
        s.rules_wanted = 1;
        s.inward_overflow = Some("513 ResourceSlice taints\n".into());
        let l = judge(&Ok(Some(s)), 1000);
        assert_eq!(l.mark, Mark::Warn);
        assert!(
            l.text
                .contains("overflowed (513 ResourceSlice taints\\x0a)"),
            "{}",
            l.text
        );
    }
}
