//! The OCI runtime wrapper: `devgate runtime ARGS...`, or `devgate-runtime ARGS...` (a
//! link to devgate under that name, for configs that take one path: containerd's runc.v2
//! `BinaryName`, CRI-O's `runtime_path`, podman's `--runtime`).
//!
//! For `create` and `run` it gates the container as the prestart hook would (discover,
//! probe, policy), and a remap is written into the spec file, so that the runtime creates
//! the spare's node and grants it itself, on every cgroup version and driver. Then it
//! execs the real runtime (`runtime.path`) with every argument unchanged. A reject prints
//! its line, appends it to the runtime's `--log` (where containerd's shim reads "OCI
//! runtime create failed: ..."), and never runs the runtime.
//!
//! `update` keeps a remap in the resources it passes on (update.rs); `delete` gives back
//! the container's spares once the runtime has deleted it (a `create` that failed runs no
//! poststop). Everything else is exec'd as it came.

pub mod argv;
pub mod device_rules;
pub mod remap_spec;
pub mod runtime;
pub mod spec_rewrite;
pub mod update;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::front;
use crate::fsutil::program;
use crate::gpu;
use crate::oci::spec::Spec;
use crate::oci::state::State;
use crate::pipeline::{self, Reply};
use crate::store::lease::{holder_alive, Leases};
use crate::store::marker;
use argv::{Command, Create, Global, Invocation, LogFormat, Resources, Update};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The name the wrapper answers to as argv[0].
pub const PROGRAM: &str = "devgate-runtime";

/// Whether devgate was started as `devgate-runtime`.
pub fn invoked_as_runtime(argv0: Option<&OsStr>) -> bool {
    argv0
        .map(Path::new)
        .and_then(Path::file_name)
        .is_some_and(|n| n == PROGRAM)
}

/// `devgate [--config PATH] runtime ARGS...`: everything after `runtime` is the runtime's,
/// untouched by devgate's own option parser.
pub fn cli(argv: &[String], started: Instant) -> Option<i32> {
    let mut config = None;
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--config" => {
                config = argv.get(i + 1).map(PathBuf::from);
                i += 2;
            }
            s if s.starts_with("--config=") => {
                config = Some(PathBuf::from(&s["--config=".len()..]));
                i += 1;
            }
            "runtime" => {
                return Some(main(
                    &argv[i + 1..],
                    config.as_deref(),
                    started,
                    GateIn::Here,
                ))
            }
            _ => return None,
        }
    }
    None
}

/// Where a create's gate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateIn {
    /// In this process: devgate itself (`devgate runtime`, or linked as devgate-runtime).
    Here,
    /// In `devgate runtime`, exec'd with the same arguments: the statically linked
    /// devgate-runtime, which cannot load NVML, hands on every create whose spec names
    /// devices (`crate::front::hand_on`). The rest (no devices, update, delete, the
    /// others) it does itself.
    Devgate,
}

/// Runs the wrapper on the runtime's arguments; returns only when it does not exec. Every
/// early return writes to the shim's log with the arguments' global flags (`fail`,
/// `log_error`).
pub fn main(args: &[String], config_path: Option<&Path>, started: Instant, gate_in: GateIn) -> i32 {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let inv = argv::parse(args, &cwd);
    if program::started_with(program::Mark::Wrapped) {
        return fail(
            &inv.global,
            &Error::invalid(
                "runtime.path",
                "leads back to devgate's runtime wrapper (a loop of wrappers)",
            ),
        );
    }
    // Handed on before the config is read: devgate reads it, and resolves the runtime,
    // itself.
    if let (GateIn::Devgate, Command::Create(c) | Command::Run(c)) = (gate_in, &inv.command) {
        if c.id.is_some() && front::create_needs_devgate(&c.spec_file) {
            return fail(&inv.global, &front::hand_on(args));
        }
    }
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => return fail(&inv.global, &e),
    };
    let real = match runtime::resolve_configured(&config) {
        Ok(p) => p,
        Err(e) => return fail(&inv.global, &e),
    };
    match &inv.command {
        // no device to gate (a spec that may name one was handed on above)
        Command::Create(c) | Command::Run(c) if gate_in == GateIn::Devgate && c.id.is_some() => {
            exec(&inv.global, &real, args)
        }
        Command::Create(c) | Command::Run(c) => create(&config, &inv, c, &real, args, started),
        Command::Update(u) => run_update(&config, &inv.global, u, &real, args),
        Command::Delete { id: Some(id) } => delete(&config, &inv.global, id, &real, args),
        Command::Delete { id: None } | Command::Other => exec(&inv.global, &real, args),
    }
}

/// `create` or `run` gated in this process, then the runtime exec'd unless the gate
/// rejected. Each outcome of the gate, a panic included, becomes what the shim sees.
fn create(
    config: &Config,
    inv: &Invocation,
    c: &Create,
    real: &Path,
    args: &[String],
    started: Instant,
) -> i32 {
    let name = inv.name.as_deref().unwrap_or("create");
    let witness = inv
        .global
        .root
        .clone()
        .or_else(|| default_root(real))
        .zip(c.id.as_ref())
        .map(|(root, id)| root.join(id));
    let gated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gate(config, name, c, witness, inv.global.systemd_cgroup, started)
    }));
    match gated {
        Err(_) => {
            // The panic hook printed the line; the shim needs one too.
            log_error(&inv.global, "devgate: error: internal error, please report");
            return 2;
        }
        Ok(Err(e)) => {
            return fail(&inv.global, &Error::invalid(name, e.to_string()));
        }
        Ok(Ok(Some((reply, fds)))) => {
            // NVML, loaded for a GPU, may leave descriptors without O_CLOEXEC: the
            // runtime gets only what the caller gave devgate (stdio, --preserve-fds).
            cloexec_new_fds(&fds);
            for line in &reply.stderr {
                eprintln!("{line}");
            }
            if reply.exit_code != 0 {
                let msg = reply.message.as_deref().unwrap_or("devgate: rejected");
                log_error(&inv.global, msg);
                return reply.exit_code;
            }
        }
        Ok(Ok(None)) => {}
    }
    exec(&inv.global, real, args)
}

/// runc's and crun's state roots when none is given (as root).
fn default_root(real: &Path) -> Option<PathBuf> {
    let name = real.file_name()?.to_str()?;
    Some(PathBuf::from(if name == "crun" {
        "/run/crun"
    } else {
        "/run/runc"
    }))
}

/// The gate on the spec the runtime is about to read, and the descriptors open before it;
/// None when there is nothing to decide (no container id, no devices).
fn gate(
    config: &Config,
    name: &str,
    c: &Create,
    witness: Option<PathBuf>,
    systemd: bool,
    started: Instant,
) -> Result<Option<(Reply, BTreeSet<i32>)>> {
    let Some(id) = &c.id else {
        return Ok(None); // the runtime says what is missing
    };
    let (spec, bytes) = Spec::read(&c.spec_file)?;
    if !gpu::may_have_devices(&spec) {
        return Ok(None);
    }
    let fds = open_fds();
    let state = State {
        id: id.clone(),
        status: "creating".into(),
        pid: None,
        bundle: c.bundle.clone(),
        annotations: Default::default(),
    };
    let mut remap = remap_spec::SpecRemap {
        id,
        spec_file: &c.spec_file,
        bytes,
        runtime_state: witness,
        systemd,
        user_namespace: spec.user_namespace(),
    };
    let reply = pipeline::gate_with(name, &state, &spec, config, started, &mut |cfg, l, g, d| {
        remap.apply(cfg, l, g, d)
    })?;
    if reply.exit_code == 0 {
        if let Some(action) = reply.action {
            // Without the marker the hook only decides again, on the spec as rewritten:
            // slower, never wrong.
            let decided = marker::Decided {
                id,
                spec: &remap.bytes,
                action,
                runtime_state: remap.runtime_state.as_deref(),
            };
            if let Err(e) = marker::write(&config.state_dir, &decided, config.exits_keep) {
                log::error!("cannot keep the decided marker for {id}: {e}");
            }
        }
    }
    Ok(Some((reply, fds)))
}

fn run_update(config: &Config, global: &Global, u: &Update, real: &Path, args: &[String]) -> i32 {
    let (Some(id), Some(res)) = (&u.id, &u.resources) else {
        return exec(global, real, args);
    };
    let leases = match Leases::new(&config.state_dir).held_by(id) {
        Ok(l) => l,
        // Passing the resources on unread could re-allow a bad device (crun).
        Err(e) => return fail(global, &e),
    };
    if leases.is_empty() {
        return exec(global, real, args);
    }
    let swaps = update::swaps(&leases);
    let result = match res {
        Resources::Stdin => update::read(std::io::stdin().lock(), Path::new("stdin")),
        Resources::File(p) => std::fs::File::open(p)
            .map_err(|e| Error::io("cannot open update resources", p, e))
            .and_then(|f| update::read(f, p)),
    }
    .map(|input| update::rewrite(&input, &swaps))
    .and_then(|out| program::memfd("devgate-resources", &out));
    let fd = match result {
        Ok(f) => f,
        Err(e) => return fail(global, &e),
    };
    let mut args = args.to_vec();
    match (res, u.resources_at) {
        (Resources::Stdin, _) => {
            if let Err(e) = program::set_stdin(&fd) {
                return fail(global, &e);
            }
        }
        (Resources::File(_), Some(at)) => {
            use std::os::fd::AsRawFd;
            args[at] = format!("{}/proc/self/fd/{}", u.resources_prefix, fd.as_raw_fd());
        }
        (Resources::File(_), None) => {}
    }
    exec(global, real, &args)
}

/// `delete`: the runtime deletes, then the container's spares and marker go, so that a
/// container whose `create` failed (no poststop ever runs) gives its spare back too. The
/// runtime runs as a child only when there is something to give back.
fn delete(config: &Config, global: &Global, id: &str, real: &Path, args: &[String]) -> i32 {
    let leases = Leases::new(&config.state_dir);
    let held = leases.held_by(id).unwrap_or_default();
    let decided = marker::read(&config.state_dir, id).is_some();
    if held.is_empty() && !decided {
        return exec(global, real, args);
    }
    let mut cmd = std::process::Command::new(real);
    if runtime::may_lead_back(real) {
        cmd.env(runtime::WRAPPED_ENV, "1");
    }
    let status = match cmd.args(args).status() {
        Ok(s) => s,
        Err(e) => return fail(global, &Error::io("cannot run", real, e)),
    };
    // A delete that failed may have left a live container: only leases whose holder is
    // gone are given back then.
    for l in held.iter().filter(|l| status.success() || !holder_alive(l)) {
        if let Err(e) = leases.release(l.spare, id) {
            log::error!("cannot give back spare {} of {id}: {e}", l.spare);
        }
    }
    if status.success() {
        if let Err(e) = marker::remove(&config.state_dir, id) {
            log::error!("cannot remove the decided marker of {id}: {e}");
        }
    }
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn exec(global: &Global, real: &Path, args: &[String]) -> i32 {
    // The loop marker goes into devgate's own environment, which the runtime inherits,
    // rather than through `Command::env`: that copies the whole environment into a map and
    // back on every call, some 70k instructions, a fifth of the wrapper's own cost. The
    // wrapper has no other thread that could read the environment meanwhile.
    if runtime::may_lead_back(real) {
        // Start-up trick (docs/performance.md). Plain: `Command::env`.
        std::env::set_var(runtime::WRAPPED_ENV, "1");
    }
    let e = std::process::Command::new(real).args(args).exec();
    fail(global, &Error::io("cannot run", real, e))
}

fn fail(global: &Global, e: &Error) -> i32 {
    let line = crate::model::text::one_line(&format!("devgate: error: {e}"));
    eprintln!("{line}");
    log_error(global, &line);
    2
}

/// One error entry in the runtime's log, in its format: the runc shim reads the last
/// `"level":"error"` entry of a JSON log into its "OCI runtime create failed" message.
pub fn log_entry(format: LogFormat, msg: &str, time: &str) -> String {
    match format {
        LogFormat::Json => {
            serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
        }
        LogFormat::Text => format!("time={time:?} level=error msg={msg:?}"),
    }
}

fn log_error(global: &Global, msg: &str) {
    let Some(path) = &global.log else { return };
    let (_, time) = crate::model::clock::now();
    let mut line = log_entry(global.log_format, msg, &time);
    line.push('\n');
    let written = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "{}",
            crate::model::text::one_line(&format!(
                "devgate: error: cannot write the runtime log {}: {e}",
                path.display()
            ))
        );
    }
}

fn open_fds() -> BTreeSet<i32> {
    std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn cloexec_new_fds(before: &BTreeSet<i32>) {
    for fd in open_fds().difference(before) {
        // SAFETY: setting FD_CLOEXEC on a descriptor number changes no memory; one that
        // was the read_dir's own is closed already and the call fails harmlessly.
        unsafe {
            let flags = libc::fcntl(*fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(*fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv0_and_cli_dispatch() {
        assert!(invoked_as_runtime(Some(OsStr::new(
            "/usr/bin/devgate-runtime"
        ))));
        assert!(invoked_as_runtime(Some(OsStr::new("devgate-runtime"))));
        assert!(!invoked_as_runtime(Some(OsStr::new("/usr/bin/devgate"))));
        assert!(!invoked_as_runtime(None));
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(cli(&v("status --json"), Instant::now()), None);
        assert_eq!(
            cli(&v("--config /c.json hook prestart"), Instant::now()),
            None
        );
    }

    #[test]
    fn log_entries_as_runc_writes_them() {
        let j = log_entry(
            LogFormat::Json,
            "devgate: rejected \"x\"",
            "2026-01-01T00:00:00Z",
        );
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "devgate: rejected \"x\"");
        assert_eq!(v["time"], "2026-01-01T00:00:00Z");
        assert_eq!(
            log_entry(LogFormat::Text, "a \"b\"", "t"),
            r#"time="t" level=error msg="a \"b\"""#
        );
    }

    #[test]
    fn default_roots() {
        assert_eq!(
            default_root(Path::new("/usr/bin/crun")).unwrap(),
            Path::new("/run/crun")
        );
        assert_eq!(
            default_root(Path::new("/usr/sbin/runc")).unwrap(),
            Path::new("/run/runc")
        );
    }
}
