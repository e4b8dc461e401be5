//! The command line: `devgate hook STAGE` for runtimes, and a few operator commands.
//! Thin over the library; every failure is one `devgate: error: ...` line.

/// println! for the operator commands: see [`out::write_stdout`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::out::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}

mod args;
mod conffile;
mod containerd_config;
mod containerd_crun;
mod containerd_dropin;
mod cri_plugins;
mod crun_wrap;
pub(crate) mod doctor;
mod enable;
pub(crate) mod hooks_config;
mod host;
// Shared with the node agent (agent/), which runs the host's devgate the same way.
pub mod host_exec;
mod host_opts;
mod install;
mod node;
mod out;
mod runtime_confs;
mod systemd;
mod uninstall;
mod wrapper_config;

use crate::error::{Error, Result};
use crate::model::text::one_line;
use args::{parse_args, Args};
pub use out::exit;
use out::fail;
use std::time::Instant;

pub(crate) const USAGE: &str = "\
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
  uninstall-host --root DIR [--prefix DIR] [--hooks-dir DIR] [--programs]
                             take devgate's hooks off a host (base spec without hooks); after
                             the runtime restarts, --programs removes the programs
  doctor [--bin PATH] [--hooks-dir DIR]... [--crio-config FILE] [--containerd BIN]
         [--containerd-config FILE] [--nvidia-runtime-config FILE] [--kubelet-config FILE]
                             check the install: one ✓/✗ line per check, each ✗ with its fix;
                             exit 1 if any failed. The options replace where it looks
                             (default: the node's own files, runtimes found in PATH)
  version                    print the version (also --version, -V)

--config PATH (or DEVGATE_CONFIG) names the config file; default /etc/devgate/config.json.
DEVGATE_LOG sets the log level (error, warn, info, debug, trace). help, -h or --help prints
this text.";

/// A command line no command matches, as one line: the command's own synopsis from USAGE
/// when the word is a command (wrong or missing arguments), else where the list is. The
/// whole usage text is many lines, and an error is printed escaped onto one.
fn bad_command_line(pos: &[&str]) -> Error {
    let Some(word) = pos.first() else {
        return Error::Usage("no command; `devgate help` lists them".into());
    };
    let synopsis = USAGE
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| !l.starts_with(' ') && l.split_whitespace().next() == Some(word))
        // the synopsis ends where the two-space gap before the description starts
        .find_map(|l| l.split("  ").next());
    match synopsis {
        Some(s) => Error::Usage(format!(
            "bad command line: {}; usage: devgate [--config PATH] {s}",
            pos.join(" ")
        )),
        None => Error::Usage(format!(
            "unknown command {word:?}; `devgate help` lists the commands"
        )),
    }
}

/// The parser here knows the options of every command at once; one given to a command
/// that does not take it (`check --json`) is an error, not silently ignored.
fn options_belong(args: &Args, command: &str) -> Result<()> {
    let takes: &[&str] = match command {
        "cordon" => &["--reason"],
        "status" | "explain" => &["--json"],
        "metrics" => &["--textfile"],
        "uncordon" | "check" | "hook" | "version" | "help" => &[],
        // not a command: the bad command line is the error to report
        _ => return Ok(()),
    };
    let given = [
        ("--json", args.json),
        ("--reason", args.reason.is_some()),
        ("--textfile", args.textfile.is_some()),
    ];
    match given.iter().find(|(o, g)| *g && !takes.contains(o)) {
        Some((o, _)) => Err(Error::Usage(format!("{command} does not take {o}"))),
        None => Ok(()),
    }
}

/// Runs the command and returns the exit status.
pub fn main(argv: Vec<String>, started: Instant) -> i32 {
    // The runtime wrapper's arguments are the runtime's, never devgate's options.
    if let Some(code) = crate::wrapper::cli(&argv, started) {
        return code;
    }
    // hooks-config and install-host parse their own options (src/hooks_config.rs).
    if let Some(code) = host::cli(&argv) {
        return code;
    }
    if let Some(code) = doctor::cli(&argv) {
        return code;
    }
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    let pos: Vec<&str> = args.positional.iter().map(String::as_str).collect();
    if let Err(e) = options_belong(&args, pos.first().copied().unwrap_or("")) {
        return fail(&e);
    }
    let result = match pos.as_slice() {
        // also what the hook front runs (crate::front), and where it hands on from
        ["hook", stage] => {
            return crate::front::run_hook(stage, args.config.as_deref(), &argv, started)
        }
        ["cordon", dev] => node::cordon(&args, dev),
        ["uncordon", dev] => node::uncordon(&args, dev),
        ["status"] => node::status(&args),
        ["check"] => return node::check(&args),
        ["metrics"] => node::metrics(&args),
        ["explain", id] => node::explain(&args, id),
        ["version"] => {
            say!("devgate {}", crate::VERSION);
            Ok(())
        }
        // `devgate help`, and `devgate status --help` (-h/--help put "help" first)
        ["help", ..] | [] => {
            say!("{USAGE}");
            return if pos.is_empty() { 2 } else { 0 };
        }
        _ => Err(bad_command_line(&pos)),
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// `devgate-hook`, the statically linked hook front (src/hook_main.rs): `hook STAGE`, read
/// by devgate's own parser, runs here (`front::run_hook`, which hands on what may need
/// NVML); anything else goes to the dynamically linked devgate beside it at once.
pub fn hook_front(argv: Vec<String>, started: Instant) -> i32 {
    match hook_command(&argv) {
        Some((stage, args)) => {
            crate::front::run_hook(&stage, args.config.as_deref(), &argv, started)
        }
        None => fail(&crate::front::exec_devgate(&argv)),
    }
}

/// `[--config PATH] hook STAGE`, read as `run` reads it: the stage and the arguments. None
/// for any other command line, which devgate then reads itself (and reports, if wrong).
fn hook_command(argv: &[String]) -> Option<(String, Args)> {
    let args = parse_args(argv).ok()?;
    options_belong(&args, "hook").ok()?;
    match &args.positional[..] {
        [hook, stage] if hook == "hook" => Some((stage.clone(), args)),
        _ => None,
    }
}

/// The rest of a C `main` (src/main.rs, src/hook_main.rs, src/runtime_main.rs), once
/// [`process_start`] ran: logging and the panic hook, then `run`; as lang_start does, a
/// panic that reaches here ends the process with 101 after the panic hook's one line,
/// instead of unwinding out of a C function (an abort).
pub fn run_program(run: impl FnOnce() -> i32 + std::panic::UnwindSafe) -> ! {
    init_logging();
    set_panic_hook();
    let code = std::panic::catch_unwind(run).unwrap_or(101);
    exit(code)
}

/// What Rust's runtime start (lang_start) did that devgate relies on, for its C `main`s
/// (src/main.rs, src/runtime_main.rs): lang_start also finds the main thread's stack by
/// reading all of /proc/self/maps, a tenth of the hook's instructions.
pub fn process_start() {
    // Before anything reads the environment or execs: see take_marks.
    crate::fsutil::program::take_marks();
    // A closed stdout or stderr pipe is an EPIPE error to handle, not a signal that kills
    // the hook before it can answer the runtime.
    // SAFETY: sets a signal disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // A runtime may start devgate with fd 0, 1 or 2 closed; the next file devgate opened
    // would take that number, and a log line would be written into it. /dev/null takes any
    // free one first.
    for fd in 0..=2 {
        // SAFETY: F_GETFD only asks whether the fd is open; open() of a constant path.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) == -1 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// The arguments after the program's name; one that is not UTF-8 ends the process with 2.
pub fn utf8_args() -> Vec<String> {
    let Some(argv) = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().ok())
        .collect::<Option<Vec<String>>>()
    else {
        eprintln!("devgate: error: an argument is not valid UTF-8");
        exit(2)
    };
    argv
}

/// A bug must not turn into a backtrace in kubelet's event: a panic prints one line.
/// Log lines go to stderr, which runtimes pass on to kubelet's events and the operator's
/// terminal. They carry outside text (paths, kernel lines, NVML strings), so the whole line
/// goes through the one escaping function, whatever the call site did.
fn init_logging() {
    use std::io::Write;
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Warn)
        .parse_env("DEVGATE_LOG")
        .format(|buf, record| {
            writeln!(
                buf,
                "devgate: {}: {}",
                record.level().as_str().to_lowercase(),
                one_line(&record.args().to_string())
            )
        })
        .init();
}

fn set_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{}", one_line(&panic_line(info.payload(), info.location())));
    }));
}

/// `internal error, please report: MESSAGE at FILE:LINE`: a panic's own Display puts a
/// newline between the place and the message, which the escaped line showed as `\x0a`.
fn panic_line(
    payload: &(dyn std::any::Any + Send),
    at: Option<&std::panic::Location<'_>>,
) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    let at = at.map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
    format!("devgate: error: internal error, please report: {msg}{at}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_bad_command_line_is_one_line_with_the_commands_synopsis() {
        let e = bad_command_line(&["explain"]).to_string();
        assert_eq!(
            e,
            "bad command line: explain; usage: devgate [--config PATH] explain CONTAINER_ID [--json]"
        );
        let e = bad_command_line(&["status", "extra"]).to_string();
        assert!(
            e.ends_with("; usage: devgate [--config PATH] status [--json]"),
            "{e}"
        );
        let e = bad_command_line(&["hook"]).to_string();
        assert!(
            e.ends_with("usage: devgate [--config PATH] hook STAGE"),
            "{e}"
        );
        let e = bad_command_line(&["statsu"]).to_string();
        assert_eq!(
            e,
            "unknown command \"statsu\"; `devgate help` lists the commands"
        );
        // a word of a description's continuation line is no command
        let e = bad_command_line(&["startContainer,"]).to_string();
        assert!(e.starts_with("unknown command"), "{e}");
        for e in [&e, &bad_command_line(&["explain"]).to_string()] {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn an_option_of_another_command_is_an_error() {
        let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let check = |line: &str| {
            let a = parse_args(&argv(line)).unwrap();
            let cmd = a.positional.first().cloned().unwrap_or_default();
            options_belong(&a, &cmd).map_err(|e| e.to_string())
        };
        assert_eq!(
            check("check --json"),
            Err("check does not take --json".into())
        );
        assert_eq!(
            check("uncordon 195:1 --reason x"),
            Err("uncordon does not take --reason".into())
        );
        assert_eq!(
            check("status --textfile /x"),
            Err("status does not take --textfile".into())
        );
        for ok in [
            "cordon 195:1 --reason x",
            "status --json",
            "explain abc --json",
            "metrics --textfile /x",
            "check",
            "--config /c.json hook prestart",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        // an unknown word is reported as such, not as an option out of place
        assert_eq!(check("statsu --json"), Ok(()));
    }

    #[test]
    fn the_front_runs_only_the_hook_command_lines() {
        let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let hook = |s: &str| hook_command(&argv(s)).map(|(stage, args)| (stage, args.config));
        assert_eq!(hook("hook prestart"), Some(("prestart".into(), None)));
        assert_eq!(
            hook("--config /c.json hook auto"),
            Some(("auto".into(), Some(PathBuf::from("/c.json"))))
        );
        assert_eq!(
            hook("--config=/a hook poststop --config /b"),
            Some(("poststop".into(), Some(PathBuf::from("/b"))))
        );
        for other in [
            "status",
            "hook",
            "hook prestart extra",
            "hook prestart --json",
            "--help hook prestart",
            "-V hook prestart",
            "hook prestart --config",
            "--unknown hook prestart",
            "",
        ] {
            assert_eq!(hook(other), None, "{other}");
        }
    }

    #[test]
    fn a_panic_is_one_readable_line() {
        let here = std::panic::Location::caller();
        let line = panic_line(&"index out of bounds", Some(here));
        assert_eq!(
            line,
            format!(
                "devgate: error: internal error, please report: index out of bounds at {}:{}",
                here.file(),
                here.line()
            )
        );
        let owned: Box<dyn std::any::Any + Send> = Box::new(String::from("formatted 7"));
        assert!(panic_line(owned.as_ref(), None).ends_with("please report: formatted 7"));
        assert!(panic_line(&42u8, None).ends_with("please report: (no message)"));
    }

    #[test]
    fn version_and_help_flags_name_their_commands() {
        let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        for (line, first) in [
            ("--version", "version"),
            ("-V", "version"),
            ("--help", "help"),
            ("-h", "help"),
        ] {
            assert_eq!(parse_args(&argv(line)).unwrap().positional, [first]);
        }
    }
}
