//! The command line: `devgate hook STAGE` for runtimes, and a few operator commands.
//! Thin over the library; every failure is one `devgate: error: ...` line.

use crate::class;
use crate::config::Config;
use crate::device::{self, DevNum, Device, Source};
use crate::error::{Error, Result};
use crate::hook::{self, Stage};
use crate::ledger::quarantine::{self, Ledger, Lookup};
use crate::policy::{self, Disposition};
use crate::record;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub const USAGE: &str = "\
usage: devgate [--config PATH] COMMAND

commands:
  hook STAGE                 run as an OCI hook (prestart, createRuntime, createContainer,
                             startContainer, poststart, poststop); the state is read on stdin
  cordon DEVICE --reason TEXT  quarantine a device (a path under /dev, or MAJ:MIN)
  uncordon DEVICE            lift a quarantine
  status [--json]            the node's accelerators, spares and quarantined devices
  explain CONTAINER_ID [--json]  what devgate decided for a container
  version                    print the version

--config PATH (or DEVGATE_CONFIG) names the config file; default /etc/devgate/config.json.
DEVGATE_LOG sets the log level (error, warn, info, debug, trace).";

#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    json: bool,
    reason: Option<String>,
    positional: Vec<String>,
}

fn parse_args(argv: &[String]) -> Result<Args> {
    let mut a = Args::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| Error::Usage(format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--config" => a.config = Some(PathBuf::from(value("--config")?)),
            "--reason" => a.reason = Some(value("--reason")?),
            "--json" => a.json = true,
            "-h" | "--help" => a.positional.insert(0, "help".into()),
            s if s.starts_with("--config=") => a.config = Some(PathBuf::from(&s[9..])),
            s if s.starts_with("--reason=") => a.reason = Some(s[9..].to_string()),
            s if s.starts_with("--") => return Err(Error::Usage(format!("unknown option {s}"))),
            _ => a.positional.push(arg.clone()),
        }
    }
    Ok(a)
}

/// Runs the command and returns the exit status.
pub fn main(argv: Vec<String>, started: Instant) -> i32 {
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    let pos: Vec<&str> = args.positional.iter().map(String::as_str).collect();
    let result = match pos.as_slice() {
        ["hook", stage] => return run_hook(stage, &args, started),
        ["cordon", dev] => cordon(&args, dev),
        ["uncordon", dev] => uncordon(&args, dev),
        ["status"] => status(&args),
        ["explain", id] => explain(&args, id),
        ["version"] => {
            println!("devgate {}", crate::VERSION);
            Ok(())
        }
        ["help"] | [] => {
            println!("{USAGE}");
            return if pos.is_empty() { 2 } else { 0 };
        }
        _ => Err(Error::Usage(format!(
            "bad command line: {}\n{USAGE}",
            argv.join(" ")
        ))),
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> i32 {
    eprintln!("devgate: error: {e}");
    2
}

fn run_hook(stage: &str, args: &Args, started: Instant) -> i32 {
    let stage = match Stage::parse(stage) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    match hook::run(
        stage,
        args.config.as_deref(),
        std::io::stdin().lock(),
        started,
    ) {
        Ok(report) => {
            for line in &report.stderr {
                eprintln!("{line}");
            }
            report.exit_code
        }
        Err(e) => {
            eprintln!("devgate: error: {stage}: {e}", stage = stage.name());
            // poststop must not fail the lifecycle once its own input was readable; the
            // error is still printed for the runtime's log.
            if stage == Stage::Poststop
                && !matches!(e, Error::TooLarge { .. } | Error::Parse { path: None, .. })
            {
                0
            } else {
                2
            }
        }
    }
}

fn cordon(args: &Args, dev: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let reason = args
        .reason
        .as_deref()
        .ok_or_else(|| Error::Usage("cordon needs --reason TEXT".into()))?;
    let (num, path) = device::parse_device_arg(dev, &config.sysfs_root)?;
    let e = Ledger::new(&config.quarantine_dir).cordon(num, path, reason, &quarantine::who())?;
    println!(
        "devgate: cordoned {} {} ({}): {:?}",
        num.typ.letter(),
        num,
        dev,
        e.reason
    );
    Ok(())
}

fn uncordon(args: &Args, dev: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let (num, _) = device::parse_device_arg(dev, &config.sysfs_root)?;
    if Ledger::new(&config.quarantine_dir).uncordon(num)? {
        println!("devgate: uncordoned {} {} ({dev})", num.typ.letter(), num);
    } else {
        println!(
            "devgate: {} {} ({dev}) was not cordoned",
            num.typ.letter(),
            num
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct StatusRow {
    #[serde(flatten)]
    device: Device,
    roles: Vec<&'static str>,
    health: &'static str,
    verdicts: Vec<crate::probe::ProbeResult>,
    reasons: Vec<String>,
    quarantine: Option<serde_json::Value>,
    lease: Option<serde_json::Value>,
}

fn host_device(num: DevNum, class: &str, host: Option<PathBuf>) -> Device {
    Device {
        num,
        class: class.to_string(),
        container_path: None,
        host_path: host,
        source: Source::LinuxDevices,
        file_mode: None,
        uid: None,
        gid: None,
    }
}

/// The node's accelerator nodes under dev_root, found by class rule.
fn accelerators(config: &Config, rules: &[class::ClassRule]) -> Vec<Device> {
    let mut out = Vec::new();
    let mut stack = vec![(config.dev_root.clone(), 0)];
    let mut budget = 8192;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            budget -= 1;
            if budget == 0 {
                return out;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() && depth < 2 {
                stack.push((e.path(), depth + 1));
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            let Some(num) = DevNum::from_metadata(&meta) else {
                continue;
            };
            // Classify by the path as it would appear in a container (/dev/...).
            let shown = Path::new("/dev")
                .join(e.path().strip_prefix(&config.dev_root).unwrap_or(&e.path()));
            let class = class::classify(rules, num.typ, num.major, num.minor, &[&shown]);
            if rules.iter().any(|r| r.class == class && r.accelerator) {
                out.push(host_device(num, class, Some(e.path())));
            }
        }
    }
    out.sort_by_key(|d| d.num);
    out
}

fn status(args: &Args) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let rules = config.class_rules();
    let ledger = Ledger::new(&config.quarantine_dir);
    let mut rows: Vec<(Device, Vec<&'static str>)> = accelerators(&config, &rules)
        .into_iter()
        .map(|d| (d, vec!["accelerator"]))
        .collect();
    let add =
        |dev: Device, role: &'static str, rows: &mut Vec<(Device, Vec<&'static str>)>| match rows
            .iter_mut()
            .find(|(d, _)| d.num == dev.num)
        {
            Some((_, roles)) => roles.push(role),
            None => rows.push((dev, vec![role])),
        };
    for (class, paths) in &config.spares {
        for p in paths {
            let num = std::fs::metadata(p)
                .ok()
                .and_then(|m| DevNum::from_metadata(&m));
            match num {
                Some(num) => add(host_device(num, class, Some(p.clone())), "spare", &mut rows),
                None => eprintln!(
                    "devgate: warning: spare {} (class {class}) is not a device node",
                    p.display()
                ),
            }
        }
    }
    for (num, _) in ledger.list()? {
        let host = device::find_host_node(&config.dev_root, &config.sysfs_root, num, &[]);
        let paths: Vec<&Path> = host.iter().map(PathBuf::as_path).collect();
        let class = class::classify(&rules, num.typ, num.major, num.minor, &paths).to_string();
        add(host_device(num, &class, host), "quarantined", &mut rows);
    }

    // Leases of spares no longer configured still show.
    let leases = crate::ledger::lease::Leases::new(&config.state_dir);
    let lease_slots = leases.list().unwrap_or_else(|e| {
        eprintln!("devgate: warning: cannot list leases: {e}");
        Vec::new()
    });
    for (num, slot) in &lease_slots {
        if let crate::ledger::lease::Slot::Held(l) = slot {
            if rows.iter().any(|(d, _)| d.num == *num) {
                continue;
            }
            add(
                host_device(*num, &l.class, Some(l.spare_path.clone())),
                "spare",
                &mut rows,
            );
        }
    }

    let devices: Vec<Device> = rows.iter().map(|(d, _)| d.clone()).collect();
    let decisions = hook::decide_all(&config, &ledger, devices);
    let out: Vec<StatusRow> = decisions
        .into_iter()
        .zip(rows)
        .map(|(dec, (_, roles))| {
            let q = match ledger.lookup(dec.device.num) {
                Lookup::Clear => None,
                Lookup::Cordoned(e) => serde_json::to_value(e).ok(),
                Lookup::Damaged { path, error } => Some(serde_json::json!({
                    "damaged": path, "error": error })),
            };
            let health = health_word(&dec);
            let lease = lease_json(&lease_slots, dec.device.num);
            let mut reasons = dec.reasons.clone();
            reasons.extend(dec.warnings.iter().cloned());
            StatusRow {
                device: dec.device,
                roles,
                health,
                verdicts: dec.verdicts,
                reasons,
                quarantine: q,
                lease,
            }
        })
        .collect();

    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("status serializes")
        );
        return Ok(());
    }
    if out.is_empty() {
        println!("no accelerators, spares or quarantined devices");
        return Ok(());
    }
    println!(
        "{:<24} {:<8} {:<12} {:<10} {:<24} QUARANTINE",
        "DEVICE", "NUMBER", "CLASS", "HEALTH", "ROLE"
    );
    for r in &out {
        let q = r
            .quarantine
            .as_ref()
            .map(|q| match (q.get("reason"), q.get("by")) {
                (Some(reason), Some(by)) => format!("{reason} by {}", by.as_str().unwrap_or("")),
                _ => "damaged entry".into(),
            })
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<24} {:<8} {:<12} {:<10} {:<24} {}",
            r.device.name(),
            r.device.num.to_string(),
            r.device.class,
            r.health,
            r.roles.join(","),
            q
        );
        for reason in &r.reasons {
            println!("    {}", policy::one_line(reason));
        }
        if let Some(l) = &r.lease {
            println!("    {}", policy::one_line(&lease_text(l)));
        } else if r.roles.contains(&"spare") {
            println!("    spare, free");
        }
    }
    Ok(())
}

fn lease_json(
    slots: &[(DevNum, crate::ledger::lease::Slot)],
    num: DevNum,
) -> Option<serde_json::Value> {
    use crate::ledger::lease::Slot;
    match slots.iter().find(|(n, _)| *n == num).map(|(_, s)| s) {
        Some(Slot::Held(l)) => serde_json::to_value(l).ok(),
        Some(Slot::Damaged { path, error }) => {
            Some(serde_json::json!({ "damaged": path, "error": error }))
        }
        _ => None,
    }
}

fn lease_text(l: &serde_json::Value) -> String {
    let s = |k: &str| l.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string();
    if l.get("damaged").is_some() {
        return format!("lease file {} is damaged: {}", s("damaged"), s("error"));
    }
    let num = |k: &str| {
        l.get(k)
            .and_then(|v| serde_json::from_value::<DevNum>(v.clone()).ok())
            .map(|n| n.to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "leased to {} (pid {}) since {}, standing in for {}{}",
        s("container_id"),
        l.get("pid").and_then(|v| v.as_i64()).unwrap_or(0),
        s("since"),
        num("replaces"),
        l.get("container_path")
            .and_then(|v| v.as_str())
            .map(|p| format!(" at {p}"))
            .unwrap_or_default()
    )
}

fn health_word(dec: &policy::DeviceDecision) -> &'static str {
    use crate::probe::Verdict;
    if dec
        .verdicts
        .iter()
        .any(|v| matches!(v.verdict, Verdict::Unhealthy(_)))
    {
        "unhealthy"
    } else if dec
        .verdicts
        .iter()
        .any(|v| matches!(v.verdict, Verdict::Unknown(_)))
    {
        "unknown"
    } else if dec.disposition == Disposition::Healthy && dec.warnings.is_empty() {
        "healthy"
    } else {
        "degraded"
    }
}

fn explain(args: &Args, id: &str) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let Some(rec) = record::read_record(&config.state_dir, id)? else {
        return Err(Error::invalid(
            format!("container {id}"),
            format!(
                "no record under {} (devgate keeps records only for containers with devices)",
                record::containers_dir(&config.state_dir).display()
            ),
        ));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rec).expect("record serializes")
        );
        return Ok(());
    }
    println!(
        "container {} at {} ({}): {:?}",
        rec.container_id, rec.stage, rec.time, rec.action
    );
    if let (Some(ns), Some(name)) = (&rec.pod.namespace, &rec.pod.name) {
        println!(
            "  pod {ns}/{name} container {}",
            rec.pod.container.as_deref().unwrap_or("?")
        );
    }
    for d in &rec.devices {
        println!(
            "  {} class {}: {:?} {}",
            d.device.describe(),
            d.device.class,
            d.disposition,
            d.rule
        );
        for v in &d.verdicts {
            println!(
                "    {:<11} {:<14} {}",
                v.probe,
                v.verdict.status(),
                v.verdict.reason().unwrap_or("")
            );
        }
    }
    for r in &rec.remaps {
        println!(
            "  remapped {} ({}) -> {} ({}): {}",
            r.container_path
                .as_deref()
                .or(r.host_path.as_deref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| format!("{} {}", r.device.typ.letter(), r.device)),
            r.device,
            r.spare_path.display(),
            r.spare,
            policy::one_line(&r.reason)
        );
        println!("    cgroup: {}", r.cgroup);
        println!("    node:   {}", policy::one_line(&r.node));
        if let Some(from) = &r.reclaimed_from {
            println!("    lease reclaimed from {from}, which no longer exists");
        }
    }
    if let Some(m) = &rec.message {
        println!("  {m}");
    }
    Ok(())
}
