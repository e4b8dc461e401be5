//! The command line: `devgate hook STAGE` for runtimes, and a few operator commands.
//! Thin over the library; every failure is one `devgate: error: ...` line.

use crate::config::Config;
use crate::device;
use crate::error::{Error, Result};
use crate::hook::{self, Stage};
use crate::inventory;
use crate::ledger::quarantine::{self, Ledger};
use crate::policy;
use crate::record;
use crate::state::State;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

pub const USAGE: &str = "\
usage: devgate [--config PATH] COMMAND

commands:
  hook STAGE                 run as an OCI hook (prestart, createRuntime, createContainer,
                             startContainer, poststart, poststop, or auto: the stage from
                             the state's status); the state is read on stdin
  runtime RUNTIME-ARGS...    the OCI runtime wrapper (also run as devgate-runtime): gates
                             create and run, remaps in the spec, then runs runtime.path
  cordon DEVICE --reason TEXT  quarantine a device (a path under /dev, or MAJ:MIN)
  uncordon DEVICE            lift a quarantine
  status [--json]            the node's accelerators, spares and quarantined devices
  explain CONTAINER_ID [--json]  what devgate decided for a container, and found at stop
  check                      one-line node summary; exit 0 healthy, 1 unhealthy, 2 unknown
                             (node-problem-detector custom plugin contract)
  metrics --textfile PATH    write Prometheus text for node_exporter's textfile collector
  hooks-config --runtime crio|podman|containerd [--wrapper] [--prefix DIR | --bin PATH]
               [--out DIR]   print (or write) the runtime configuration that runs devgate's
                             hooks, or with --wrapper devgate-runtime
  install-host --root DIR [--prefix DIR] [--config-file PATH] [--hooks-dir DIR]
                             copy devgate and its configuration onto a host (Kubernetes installer)
  version                    print the version

--config PATH (or DEVGATE_CONFIG) names the config file; default /etc/devgate/config.json.
DEVGATE_LOG sets the log level (error, warn, info, debug, trace).";

#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    json: bool,
    reason: Option<String>,
    textfile: Option<PathBuf>,
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
            "--textfile" => a.textfile = Some(PathBuf::from(value("--textfile")?)),
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
    // The runtime wrapper's arguments are the runtime's, never devgate's options.
    if let Some(code) = crate::wrapper::cli(&argv, started) {
        return code;
    }
    // hooks-config and install-host parse their own options (src/hooks_config.rs).
    if let Some(code) = crate::hooks_config::cli(&argv) {
        return code;
    }
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
        ["check"] => return check(&args),
        ["metrics"] => metrics(&args),
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
    // `auto` takes the stage from the state's status (one oci-hooks file, two stages).
    let named = match stage {
        "auto" => None,
        s => match Stage::parse(s) {
            Ok(s) => Some(s),
            Err(e) => return fail(&e),
        },
    };
    let state = match State::read(std::io::stdin().lock()) {
        Ok(s) => s,
        Err(e) => {
            // Unreadable input is the one error that fails even poststop.
            eprintln!("devgate: error: {stage}: {e}");
            return 2;
        }
    };
    let stage = named.unwrap_or_else(|| Stage::from_status(&state.status));
    // A bug must not turn into a backtrace in kubelet's event or a failed poststop: the
    // panic hook (main.rs) prints one line, and the stage decides the exit.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        hook::run(stage, &state, args.config.as_deref(), started)
    }));
    let Ok(result) = run else {
        return if stage == Stage::Poststop { 0 } else { 2 };
    };
    match result {
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
            if stage == Stage::Poststop {
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

fn status(args: &Args) -> Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let rows = inventory::collect(&config)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("status serializes")
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no accelerators, spares, quarantined or assigned devices");
        return Ok(());
    }
    println!(
        "{:<24} {:<8} {:<12} {:<10} {:<24} QUARANTINE",
        "DEVICE", "NUMBER", "CLASS", "HEALTH", "ROLE"
    );
    for r in &rows {
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
            r.health.as_str(),
            r.roles.join(","),
            q
        );
        for reason in &r.reasons {
            println!("    {}", policy::one_line(reason));
        }
        if let Some(g) = &r.gpu {
            println!(
                "    gpu minor {} uuid {} pci {}",
                g.minor,
                g.uuid.as_deref().unwrap_or("?"),
                g.pci_bus_id.as_deref().unwrap_or("?")
            );
            for c in &g.checks {
                let line = format!(
                    "      {:<14} {:<14} {}",
                    c.check,
                    c.verdict.status(),
                    policy::one_line(c.verdict.reason().unwrap_or(""))
                );
                println!("{}", line.trim_end());
            }
        }
        if let Some(l) = &r.lease {
            println!("    {}", policy::one_line(&lease_text(l)));
        } else if r.roles.contains(&"spare") {
            println!("    spare, free");
        }
    }
    Ok(())
}

/// node-problem-detector custom plugin: one line, exit 0 / 1 / 2.
fn check(args: &Args) -> i32 {
    let rows = Config::load(args.config.as_deref()).and_then(|c| inventory::collect(&c));
    match rows {
        Ok(rows) => {
            let (code, line) = inventory::check_summary(&rows);
            println!("{}", policy::one_line(&line));
            code
        }
        Err(e) => {
            println!("devgate: unknown: {e}");
            2
        }
    }
}

fn metrics(args: &Args) -> Result<()> {
    let path = args
        .textfile
        .as_deref()
        .ok_or_else(|| Error::Usage("metrics needs --textfile PATH".into()))?;
    let config = Config::load(args.config.as_deref())?;
    let rows = inventory::collect(&config)?;
    let exits = record::list_exits(&config.state_dir);
    let text = inventory::metrics_text(&rows, &exits);
    let dir = path
        .parent()
        .ok_or_else(|| Error::Usage(format!("--textfile {}: no directory", path.display())))?;
    crate::fsutil::check_dir(dir)?;
    crate::fsutil::write_atomic(path, text.as_bytes(), 0o644)
}

/// A serde enum's wire name, for text output that matches the JSON.
fn word(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn explain(args: &Args, id: &str) -> Result<()> {
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
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("record serializes")
        );
        return Ok(());
    }
    if let Some(rec) = &rec {
        explain_start(rec);
    }
    match &exit {
        None => println!(
            "  stop: not recorded (still running, or stopped before devgate's poststop ran)"
        ),
        Some(x) => {
            println!(
                "  stopped at {}: {} device fault(s)",
                x.stopped,
                x.faults.len()
            );
            for f in &x.faults {
                println!("    {}", f.line());
            }
            if let Some(t) = &x.termination_message {
                let path = t
                    .host_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                println!("    termination message {path}: {}", t.note);
            }
        }
    }
    Ok(())
}

fn explain_start(rec: &record::Decision) {
    println!(
        "container {} at {} ({}): {}",
        rec.container_id,
        rec.stage,
        rec.time,
        word(&rec.action)
    );
    if let (Some(ns), Some(name)) = (&rec.pod.namespace, &rec.pod.name) {
        println!(
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
        println!(
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
                v.verdict.reason().unwrap_or("")
            );
            println!("{}", line.trim_end());
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
}

fn lease_text(l: &serde_json::Value) -> String {
    let s = |k: &str| l.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string();
    if l.get("damaged").is_some() {
        return format!("lease file {} is damaged: {}", s("damaged"), s("error"));
    }
    let num = |k: &str| {
        l.get(k)
            .and_then(|v| serde_json::from_value::<crate::device::DevNum>(v.clone()).ok())
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
