//! The operator commands: cordon and uncordon a device, and the views of the node and of
//! one container (`status`, `check`, `metrics`, `explain`).

use super::args::Args;
use crate::config::policy::Action;
use crate::config::Config;
use crate::discover::devnode::parse_device_arg;
use crate::error::{Error, Result};
use crate::fsutil::{check_dir, write_atomic};
use crate::model::text::{json_safe_string, one_line};
use crate::report::inventory::{self, Filed};
use crate::report::metrics;
use crate::report::record;
use crate::store::lease::Lease;
use crate::store::quarantine::{self, Ledger};
use serde::Serialize;

/// Prints one line of human output with everything from outside escaped (see
/// `model::text::one_line`): device paths from specs, reasons, container ids, NVML text.
macro_rules! outln {
    ($($arg:tt)*) => {
        say!("{}", one_line(&format!($($arg)*)))
    };
}

pub(super) fn cordon(args: &Args, dev: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let reason = args
        .reason
        .as_deref()
        .ok_or_else(|| Error::Usage("cordon needs --reason TEXT".into()))?;
    let (num, path) = parse_device_arg(dev, &config.sysfs_root)?;
    let ledger = Ledger::new(&config.quarantine_dir);
    // A second cordon replaces the first entry: say what it replaced, or its reason is lost
    // without a word.
    let before = match ledger.lookup(num) {
        quarantine::Lookup::Cordoned(old) => {
            format!(
                " (replaces \"{}\" by {} since {})",
                old.reason, old.by, old.since
            )
        }
        quarantine::Lookup::Damaged { .. } => " (replaces a damaged entry)".into(),
        quarantine::Lookup::Clear => String::new(),
    };
    let e = ledger.cordon(num, path, reason, &quarantine::who())?;
    outln!(
        "devgate: cordoned {} {} ({}): \"{}\"{before}",
        num.typ.letter(),
        num,
        dev,
        e.reason
    );
    Ok(())
}

pub(super) fn uncordon(args: &Args, dev: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let (num, _) = parse_device_arg(dev, &config.sysfs_root)?;
    if Ledger::new(&config.quarantine_dir).uncordon(num)? {
        outln!("devgate: uncordoned {} {} ({dev})", num.typ.letter(), num);
    } else {
        outln!(
            "devgate: {} {} ({dev}) was not cordoned",
            num.typ.letter(),
            num
        );
    }
    Ok(())
}

/// Long because it is the table `devgate status` prints, row by row; the lines belong
/// together.
pub(super) fn status(args: &Args) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let rows = inventory::collect(&config)?;
    if args.json {
        say!(
            "{}",
            json_safe_string(serde_json::to_string_pretty(&rows).expect("status serializes"))
        );
        return Ok(());
    }
    if rows.is_empty() {
        outln!("no accelerators, spares, quarantined or assigned devices");
        return Ok(());
    }
    let dev_w = column_width(rows.iter().map(|r| r.device.name()));
    let role_w = column_width(rows.iter().map(|r| r.roles.join(",")));
    outln!(
        "{:<dev_w$} {:<8} {:<12} {:<10} {:<role_w$} QUARANTINE",
        "DEVICE",
        "NUMBER",
        "CLASS",
        "HEALTH",
        "ROLE"
    );
    for r in &rows {
        let q = r
            .quarantine
            .as_ref()
            .map(|q| match q {
                // The reason quoted and escaped (outln escapes the whole line).
                Filed::Read(e) => format!("\"{}\" by {}", e.reason, e.by),
                Filed::Damaged { .. } => "damaged entry".into(),
            })
            .unwrap_or_else(|| "-".into());
        outln!(
            "{:<dev_w$} {:<8} {:<12} {:<10} {:<role_w$} {}",
            r.device.name(),
            r.device.num.to_string(),
            r.device.class,
            r.health.as_str(),
            r.roles.join(","),
            q
        );
        for reason in &r.reasons {
            outln!("    {}", one_line(reason));
        }
        if let Some(g) = &r.gpu {
            outln!(
                "    gpu minor {} uuid {} pci {}",
                g.minor,
                g.uuid.as_deref().unwrap_or("?"),
                g.pci_bus_id.as_deref().unwrap_or("?")
            );
            for c in &g.checks {
                let line = format!(
                    "      {:<15} {:<14} {}",
                    c.check,
                    c.verdict.status(),
                    one_line(c.verdict.detail().unwrap_or(""))
                );
                outln!("{}", line.trim_end());
            }
        }
        if let Some(l) = &r.lease {
            outln!("    {}", one_line(&lease_text(l)));
        } else if r.roles.contains(&"spare") {
            outln!("    spare, free");
        }
    }
    Ok(())
}

/// A column of `status` as wide as its widest cell (24 at least): a long device path
/// (`/dev/nvidia-caps/nvidia-cap12`, a dev_root elsewhere) or a spare that is also
/// quarantined would otherwise push the columns after it out of line. Measured as printed,
/// escaped. At most 64: a device's container path is the pod's choice (a bind mount's
/// destination), and one long cell must not pad every row; a longer cell overflows its own
/// row only.
fn column_width(cells: impl Iterator<Item = String>) -> usize {
    cells
        .map(|c| one_line(&c).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(24, MAX_COLUMN)
}

const MAX_COLUMN: usize = 64;

/// node-problem-detector custom plugin: one line, exit 0 / 1 / 2.
pub(super) fn check(args: &Args) -> i32 {
    let rows = Config::load(args.config.as_deref()).and_then(|c| inventory::collect(&c));
    match rows {
        Ok(rows) => {
            let (code, line) = inventory::check_summary(&rows);
            outln!("{}", one_line(&line));
            code
        }
        Err(e) => {
            outln!("devgate: unknown: {e}");
            2
        }
    }
}

pub(super) fn metrics(args: &Args) -> Result<()> {
    let path = args
        .textfile
        .as_deref()
        .ok_or_else(|| Error::Usage("metrics needs --textfile PATH".into()))?;
    // Said here with the option's name: the directory check below would name only the
    // parent, which for `devgate.prom` is the empty path.
    super::hooks_config::absolute("--textfile", path)?;
    let config = Config::load(args.config.as_deref())?;
    let rows = inventory::collect(&config)?;
    let exits = record::list_exits(&config.state_dir);
    let now = crate::model::clock::now_unix();
    let max = config.cluster_taints_max_age_s;
    let taints = crate::store::cluster::read(&config.state_dir)
        .ok()
        .flatten()
        .map(|t| metrics::TaintsAge {
            age_s: now.saturating_sub(t.written_unix),
            stale: t.stale_age(now, max).is_some(),
        });
    let text = metrics::metrics_text(&rows, &exits, taints);
    let dir = path
        .parent()
        .ok_or_else(|| Error::Usage(format!("--textfile {}: no directory", path.display())))?;
    check_dir(dir)?;
    write_atomic(path, text.as_bytes(), 0o644)
}

/// A serde enum's wire name, for text output that matches the JSON.
fn word(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

pub(super) fn explain(args: &Args, id: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let rec = record::read_record(&config.state_dir, id)?;
    let exit = record::read_exit(&config.state_dir, id)?;
    if rec.is_none() && exit.is_none() {
        return Err(Error::invalid(
            format!("container {id}"),
            format!(
                "no record under {} (devgate keeps records only for containers with devices)",
                config.state_dir.display()
            ),
        ));
    }
    if args.json {
        let v = serde_json::json!({ "start": rec, "stop": exit });
        say!(
            "{}",
            json_safe_string(serde_json::to_string_pretty(&v).expect("record serializes"))
        );
        return Ok(());
    }
    if let Some(rec) = &rec {
        explain_start(rec);
    }
    let rejected = rec.as_ref().is_some_and(|r| r.action == Action::Reject);
    match &exit {
        None if rejected => outln!("  stop: none (the start was rejected; it never ran)"),
        None => {
            outln!("  stop: not recorded (still running, or stopped before devgate's poststop ran)")
        }
        Some(x) => {
            outln!(
                "  stopped at {}: {} device fault(s)",
                x.stopped,
                x.faults.len()
            );
            for f in &x.faults {
                outln!("    {}", f.line());
            }
            if let Some(t) = &x.termination_message {
                let path = t
                    .host_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                outln!("    termination message {path}: {}", t.note);
                if let Some(log) = &t.log {
                    outln!("    container log: {log}");
                }
            }
        }
    }
    Ok(())
}

fn explain_start(rec: &record::Decision) {
    outln!(
        "container {} at {} ({}): {}",
        rec.container_id,
        rec.stage,
        rec.time,
        word(&rec.action)
    );
    if let (Some(ns), Some(name)) = (&rec.pod.namespace, &rec.pod.name) {
        outln!(
            "  pod {ns}/{name} container {}",
            rec.pod.container.as_deref().unwrap_or("?")
        );
    }
    for d in &rec.devices {
        let rule = if d.rule.is_empty() {
            String::new()
        } else {
            format!(" ({})", d.rule)
        };
        outln!(
            "  {} class {}: {}{rule}",
            d.device.describe(),
            d.device.class,
            word(&d.disposition)
        );
        for v in &d.verdicts {
            let line = format!(
                "    {:<11} {:<14} {}",
                v.probe,
                v.verdict.status(),
                v.verdict.detail().unwrap_or("")
            );
            outln!("{}", line.trim_end());
        }
    }
    for r in &rec.remaps {
        outln!(
            "  remapped {} ({}) -> {} ({}): {}",
            r.container_path
                .as_deref()
                .or(r.host_path.as_deref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| format!("{} {}", r.device.typ.letter(), r.device)),
            r.device,
            r.spare_path.display(),
            r.spare,
            one_line(&r.reason)
        );
        outln!("    cgroup: {}", r.cgroup);
        outln!("    node:   {}", one_line(&r.node));
        if let Some(from) = &r.reclaimed_from {
            outln!("    lease reclaimed from {from}, which no longer exists");
        }
    }
    if let Some(m) = &rec.message {
        outln!("  {m}");
    }
}

fn lease_text(l: &Filed<Lease>) -> String {
    match l {
        Filed::Damaged { damaged, error } => {
            format!("lease file {} is damaged: {error}", damaged.display())
        }
        Filed::Read(l) => format!(
            "leased to {} (pid {}) since {}, standing in for {}{}",
            l.container_id,
            l.pid,
            l.since,
            l.replaces,
            l.container_path
                .as_ref()
                .map(|p| format!(" at {}", p.display()))
                .unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_columns_widen_to_their_widest_cell() {
        let cells = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(column_width(cells(&["/dev/nvidia0"]).into_iter()), 24);
        assert_eq!(column_width(std::iter::empty()), 24);
        let long = "/dev/nvidia-caps/nvidia-cap12";
        assert_eq!(
            column_width(cells(&["/dev/nvidia0", long]).into_iter()),
            long.len()
        );
        // measured escaped, as outln prints it
        assert_eq!(
            column_width(cells(&["/dev/a\nb-is-a-long-name-of-23"]).into_iter()),
            one_line("/dev/a\nb-is-a-long-name-of-23").chars().count()
        );
        // a pod-chosen container path of 5000 characters pads no row past MAX_COLUMN
        let huge = format!("/{}", "x".repeat(5000));
        assert_eq!(column_width(cells(&[&huge]).into_iter()), MAX_COLUMN);
    }
}
