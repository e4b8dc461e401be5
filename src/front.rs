//! The static programs' hand-on to devgate, in one place. devgate is three programs from
//! one crate: `devgate`, linked dynamically because it loads NVML, and two fronts that
//! every container start runs, linked statically because a static program starts in a
//! fraction of the time (docs/changelog.md): `devgate-hook`, what the hook files run
//! (`cli::hook_front`, src/hook_main.rs), and `devgate-runtime`, the runtime wrapper
//! (`crate::wrapper`, src/runtime_main.rs). A static glibc program cannot load NVML (a
//! library linked against libc itself), so a front hands what may need it to the devgate
//! beside it, before devgate's config is read and before anything is written:
//!
//! - the hook front runs `hook STAGE` (`run_hook`): it reads the state on stdin and the
//!   spec as the stage reads it (`pipeline::Input`), and hands a call that may need NVML
//!   (`needs_devgate`) to devgate with the same arguments and the state it read as its
//!   stdin, an anonymous file (`hand_off`). Any other command it hands on at once;
//! - the runtime wrapper hands a create whose spec may name devices
//!   (`create_needs_devgate`) to `devgate runtime` with the same arguments (`hand_on`).
//!
//! Both exec devgate through `exec_devgate`: the `devgate` in the front's own directory
//! (`fsutil::program::devgate_beside`), held to the rule every program root runs for
//! devgate is (a regular executable file only root could have written), and marked as
//! handed on (`HANDED_ON_ENV`), so that a devgate there that is the front again (a link
//! or a copy) refuses rather than handing the call on to itself. devgate takes the marks
//! out of its environment at its start (`fsutil::program::take_marks`).
//! Those pieces stay in `fsutil::program`, below every layer that runs a program for
//! devgate: a static process's NVML query processes (`gpu::nvml::isolate`) are
//! that devgate too, checked and marked the same way.
//!
//! The pipeline knows nothing of this: the front decides before it calls it, on what the
//! pipeline then goes on with, read once. The dynamically linked devgate runs the same
//! `run_hook` for `devgate hook STAGE` and never hands on.

use crate::error::Error;
use crate::fsutil::program::{self, DEVGATE, HANDED_ON_ENV};
use crate::gpu;
use crate::model::text::one_line;
use crate::oci::spec::Spec;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use crate::pipeline::{self, Input};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Instant;

/// `hook STAGE` (`auto`: the stage from the state's status), in devgate and in the hook
/// front alike: the state read from stdin and the stage's input (`pipeline::Input`), then
/// the pipeline, in this process or, for a call that may need NVML in a statically linked
/// one, in the devgate beside it ([`hand_off`]). Returns the exit status.
pub(crate) fn run_hook(
    stage: &str,
    config: Option<&Path>,
    argv: &[String],
    started: Instant,
) -> i32 {
    let (stage, bytes, state) = match read_state(stage) {
        Ok(read) => read,
        Err(code) => return code,
    };
    // A bug must not turn into a backtrace in kubelet's event or a failed poststop: the
    // panic hook (main.rs) prints one line, and the stage decides the exit.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let input = Input::read(stage, &state)?;
        if needs_devgate(&input) {
            // Nothing was decided or written: devgate reads the state and the spec again.
            drop(input);
            return Err(hand_off(argv, &bytes));
        }
        pipeline::run(stage, &state, input, config, started)
    }));
    // poststop must not fail the lifecycle once its own input was readable; an error is
    // still printed for the runtime's log.
    let failed = if stage == Stage::Poststop { 0 } else { 2 };
    let Ok(result) = run else {
        return failed;
    };
    match result {
        Ok(reply) => {
            for line in &reply.stderr {
                eprintln!("{line}");
            }
            reply.exit_code
        }
        Err(e) => {
            print_error(&format!("devgate: error: {}: {e}", stage.name()));
            failed
        }
    }
}

/// The stage `stage` names (or the state's status, for `auto`), the state's bytes as read
/// from stdin and the state; Err with the exit status, the error printed.
fn read_state(stage: &str) -> std::result::Result<(Stage, Vec<u8>, State), i32> {
    // `auto` takes the stage from the state's status (one oci-hooks file, two stages).
    let named = match stage {
        "auto" => None,
        s => Some(Stage::parse(s).map_err(|e| fail(&e))?),
    };
    // A runtime always pipes the state in. On a terminal (an operator trying the command)
    // the read would wait for an end of input nobody knows to type.
    // SAFETY: isatty only asks about fd 0.
    if unsafe { libc::isatty(0) } == 1 {
        print_error(&format!(
            "devgate: error: {stage}: the container state is read on stdin, which is a \
             terminal; runtimes pipe it in (echo STATE_JSON | devgate hook {stage})"
        ));
        return Err(2);
    }
    let (bytes, state) = State::read(std::io::stdin().lock()).map_err(|e| {
        // Unreadable input is the one error that fails even poststop.
        print_error(&format!("devgate: error: {stage}: {e}"));
        2
    })?;
    let stage = named.unwrap_or_else(|| Stage::from_status(&state.status));
    Ok((stage, bytes, state))
}

/// Whether this hook call goes to the dynamically linked devgate: this process is linked
/// statically (the hook front) and the call may need NVML, as far as the spec's text shows
/// (`gpu::may_name_nvidia`, docs/hook.md), before devgate's config is read.
fn needs_devgate(input: &Input) -> bool {
    // Start-up trick (docs/performance.md). Plain: hand every hook to devgate.
    program::linked_statically()
        && match input {
            Input::Nothing => false,
            Input::Gate(to_gate) => gpu::may_name_nvidia(&to_gate.spec),
            // With the bundle gone only the start record tells whether there was a GPU:
            // the devgate that can load NVML reads it.
            Input::Poststop(spec) => spec.as_ref().map_or(true, gpu::may_name_nvidia),
        }
}

/// Runs the dynamically linked devgate beside this statically linked one in its place, with
/// the same arguments and the state it read from stdin as its stdin. Returns only on
/// failure, with the error.
fn hand_off(argv: &[String], state: &[u8]) -> Error {
    let input = match program::memfd("devgate-state", state) {
        Ok(f) => f,
        Err(e) => return e,
    };
    if let Err(e) = program::set_stdin(&input) {
        return e;
    }
    // fd 0 is the state now; the memfd's own descriptor (not close-on-exec) would cross the
    // exec as a second, writable copy nothing reads.
    drop(input);
    exec_devgate(argv)
}

/// Whether the statically linked runtime wrapper hands a create (or run) whose spec is
/// `spec_file` to `devgate runtime` ([`hand_on`]): when the spec may name devices, what
/// the gate would find first (a spec with no devices has nothing to decide). One that
/// cannot be read goes to devgate, which says why as the gate would.
pub(crate) fn create_needs_devgate(spec_file: &Path) -> bool {
    Spec::read(spec_file).map_or(true, |(spec, _)| gpu::may_have_devices(&spec))
}

/// `devgate runtime ARGS`, the devgate beside this program, in its place. Returns only on
/// failure, with the error.
pub(crate) fn hand_on(args: &[String]) -> Error {
    let mut argv = vec!["runtime".to_string()];
    argv.extend_from_slice(args);
    exec_devgate(&argv)
}

/// Execs the devgate beside this program (`fsutil::program::devgate_beside`, checked) in
/// its place, as `devgate ARGS`, marked as handed on ([`HANDED_ON_ENV`]): devgate itself,
/// which takes the mark out of its environment at its start
/// (`fsutil::program::take_marks`). Returns only on failure, with the error.
pub(crate) fn exec_devgate(args: &[String]) -> Error {
    let devgate = match program::devgate_beside() {
        Ok(p) => p,
        Err(e) => return e,
    };
    // The mark goes into this process's own environment, which exec passes on, rather than
    // through `Command::env`, which copies the whole environment into a map and back (some
    // 70k instructions, as the runtime wrapper found); the front has no other thread.
    // Start-up trick (docs/performance.md). Plain: `Command::env`.
    std::env::set_var(HANDED_ON_ENV, "1");
    let e = std::process::Command::new(&devgate)
        .arg0(DEVGATE)
        .args(args)
        .exec();
    Error::io("cannot run", &devgate, e)
}

/// Prints `e` as devgate's one error line; the exit status of a failed command. (cli's
/// commands print theirs through this too.)
pub(crate) fn fail(e: &Error) -> i32 {
    print_error(&format!("devgate: error: {e}"));
    2
}

/// An error names spec paths and other outside text: printed as one escaped line, like
/// every other line devgate prints.
fn print_error(line: &str) {
    eprintln!("{}", one_line(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_in_the_dynamically_linked_devgate_is_never_handed_on() {
        // cargo's test binaries are dynamically linked, as devgate is.
        assert!(!needs_devgate(&Input::Poststop(None)));
        assert!(!needs_devgate(&Input::Nothing));
    }
}
