//! Bad input to `devgate hook`: every case is one clear line on stderr, a non-zero exit
//! and no panic.

mod common;
use common::*;
use std::fs;
use std::io::Write;
use std::process::Output;

fn hook_with_stdin(env: &Env, stage: &str, stdin: &[u8]) -> Output {
    env.hook_stdin(stage, stdin)
}

/// Exactly one stderr line, starting with `want`, and a non-zero exit.
fn assert_one_line_error(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{}", text(out));
    assert!(
        out.status.code().is_some(),
        "killed by a signal: {}",
        text(out)
    );
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line: {err}");
    assert!(
        lines[0].starts_with(want),
        "expected {want:?}, got {:?}",
        lines[0]
    );
}

#[test]
fn empty_stdin() {
    let env = Env::new("empty");
    let out = hook_with_stdin(&env, "prestart", b"");
    assert_one_line_error(&out, "devgate: error: prestart: state on stdin: empty");
}

#[test]
fn truncated_state() {
    let env = Env::new("trunc");
    let out = hook_with_stdin(&env, "prestart", br#"{"ociVersion":"1.0.2","id":"x","bund"#);
    assert_one_line_error(
        &out,
        "devgate: error: prestart: state on stdin: line 1 column",
    );
}

#[test]
fn oversized_state() {
    let env = Env::new("big");
    let big = vec![b' '; 3 << 20];
    let out = hook_with_stdin(&env, "prestart", &big);
    assert_one_line_error(
        &out,
        "devgate: error: prestart: state on stdin exceeds 1 MiB",
    );
}

#[test]
fn state_for_missing_bundle() {
    let env = Env::new("nobundle");
    let out = hook_with_stdin(
        &env,
        "prestart",
        br#"{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"/nonexistent/bundle"}"#,
    );
    assert_one_line_error(
        &out,
        "devgate: error: prestart: cannot open bundle config /nonexistent/bundle/config.json: no such file",
    );
}

#[test]
fn huge_config_json() {
    let env = Env::new("hugecfg");
    let b = Bundle::new("hugecfg", &["true"]);
    let mut f = fs::File::create(b.dir.join("config.json")).unwrap();
    f.write_all(b"{\"annotations\":{\"pad\":\"").unwrap();
    f.write_all(&vec![b'x'; 20 << 20]).unwrap();
    f.write_all(b"\"}}").unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(&out, "devgate: error: prestart: bundle config");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exceeds 16 MiB"),
        "{}",
        text(&out)
    );
}

#[test]
fn config_json_that_is_not_json() {
    let env = Env::new("garbage");
    let b = Bundle::new("garbage", &["true"]);
    fs::write(b.dir.join("config.json"), b"\x00\xffnot json").unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(&out, "devgate: error: prestart: cannot parse ");
}

/// A config.json that runc (Go's encoding/json: keys folded, the last duplicate wins) would
/// read apart from devgate is refused at prestart, with the file and the key named.
#[test]
fn config_json_keys_runc_reads_otherwise_are_refused() {
    let env = Env::new("gokeys");
    let mut b = Bundle::new("gokeys", &["true"]);
    b.spec["linux"]["Devices"] = serde_json::json!([
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}
    ]);
    b.write();
    let cfg = b.dir.join("config.json");
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(
        &out,
        &format!(
            "devgate: error: prestart: {}: non-canonical key \"Devices\" at linux",
            cfg.display()
        ),
    );
    // a second "env" (serde_json::Value cannot hold one: written as text)
    b.spec["linux"].as_object_mut().unwrap().remove("Devices");
    b.write();
    let text = fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("\"env\": ["), "{text}");
    let text = text.replacen("\"env\": [", "\"env\": [\"A=1\"], \"env\": [", 1);
    fs::write(&cfg, text).unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(
        &out,
        &format!(
            "devgate: error: prestart: {}: duplicate key \"process.env\"",
            cfg.display()
        ),
    );
}

#[test]
fn device_with_absurd_numbers() {
    let env = Env::new("absurd");
    let mut b = Bundle::new("absurd", &["true"]);
    b.spec["linux"]["devices"] = serde_json::json!([
        {"path": "/dev/x", "type": "c", "major": 4_000_000_000_i64, "minor": 1}
    ]);
    b.write();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(
        &out,
        "devgate: error: prestart: config.json linux.devices[0] /dev/x: major 4000000000 out of range 0-4095",
    );
    // a number that does not even fit the wide integer
    b.spec["linux"]["devices"] = serde_json::json!([
        {"path": "/dev/x", "type": "c", "major": 1e300, "minor": 1}
    ]);
    b.write();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(&out, "devgate: error: prestart: cannot parse ");
}

#[test]
fn malformed_devgate_config_names_file_and_position() {
    let env = Env::new("badcfg");
    fs::write(
        &env.config,
        b"{\n  \"policy\": {\"default\": \"rejcet\"}\n}",
    )
    .unwrap();
    let mut b = Bundle::new("badcfg", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(
        &out,
        &format!(
            "devgate: error: prestart: config {}: line 2 column",
            env.config.display()
        ),
    );
}

#[test]
fn unknown_stage_and_bad_command_line() {
    let env = Env::new("stage");
    let out = hook_with_stdin(&env, "prestrat", b"{}");
    assert_one_line_error(&out, "devgate: error: unknown hook stage \"prestrat\"");
    let out = env.devgate(&["cordon", "/dev/zero"]);
    assert_one_line_error(&out, "devgate: error: cordon needs --reason TEXT");
    let out = env.devgate(&["cordon", "99999:1", "--reason", "x"]);
    assert_one_line_error(
        &out,
        "devgate: error: device \"99999:1\": major 99999 out of range",
    );
}

#[test]
fn stages_with_nothing_to_do_exit_zero() {
    let env = Env::new("noop");
    let b = Bundle::new("noop", &["true"]);
    b.write();
    for stage in ["createContainer", "startContainer", "poststart", "poststop"] {
        let out = hook_with_stdin(&env, stage, b.state_json("x").as_bytes());
        assert_eq!(out.status.code(), Some(0), "{stage}: {}", text(&out));
        assert!(out.stderr.is_empty(), "{stage}: {}", text(&out));
    }
}

#[test]
fn poststop_fails_only_on_its_own_input() {
    let env = Env::new("ps-input");
    for bad in [
        &b""[..],
        b"{",
        br#"{"id":"","bundle":"/b"}"#,
        br#"{"id":"a","bundle":"rel"}"#,
    ] {
        let out = hook_with_stdin(&env, "poststop", bad);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{:?}: {}",
            String::from_utf8_lossy(bad),
            text(&out)
        );
    }
    // a readable state with a broken devgate config: poststop says so and exits 0
    let mut b = Bundle::new("ps-input", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    fs::write(&env.config, vec![b' '; 2 << 20]).unwrap();
    let out = hook_with_stdin(&env, "poststop", b.state_json("x").as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("devgate: error: poststop: config"),
        "{}",
        text(&out)
    );
}

#[test]
fn hostile_gpu_selector_is_not_a_panic() {
    let env = Env::new("selector");
    let mut b = Bundle::new("selector", &["true"]);
    b.spec["process"]["env"] = serde_json::json!(["NVIDIA_VISIBLE_DEVICES=aé€x"]);
    b.write();
    for stage in ["prestart", "poststop"] {
        let out = hook_with_stdin(&env, stage, b.state_json("x").as_bytes());
        assert_eq!(out.status.code(), Some(0), "{stage}: {}", text(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn auto_takes_the_stage_from_the_state_status() {
    let env = Env::new("auto");
    let gone = |status: &str| {
        format!(
            r#"{{"ociVersion":"1.0.2","id":"x","status":"{status}","bundle":"/nonexistent/b"}}"#
        )
    };
    // stopped: poststop, which tolerates a bundle already gone
    let out = hook_with_stdin(&env, "auto", gone("stopped").as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // runc passes creating, crun created: the gate, which needs the bundle
    for status in ["creating", "created", "something-new"] {
        let out = hook_with_stdin(&env, "auto", gone(status).as_bytes());
        assert_one_line_error(&out, "devgate: error: prestart: cannot open bundle config");
    }
}

#[test]
fn poststop_with_bundle_gone_exits_zero() {
    let env = Env::new("ps-gone");
    let out = hook_with_stdin(
        &env,
        "poststop",
        br#"{"ociVersion":"1.0.2","id":"x","status":"stopped","bundle":"/nonexistent/bundle"}"#,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // but unreadable input to poststop itself is an error
    let out = hook_with_stdin(&env, "poststop", b"{");
    assert_one_line_error(&out, "devgate: error: poststop: state on stdin");
}

/// devgate has its own C `main` (src/main.rs): an argument that is not UTF-8 is one clear
/// line and exit 2, and a hook whose stdout is a closed pipe is not killed by a signal.
#[test]
fn non_utf8_argument_and_closed_stdout() {
    use std::os::unix::ffi::OsStrExt;
    use std::process::{Command, Stdio};
    let out = Command::new(devgate_bin())
        .arg(std::ffi::OsStr::from_bytes(b"stat\xffus"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_one_line_error(&out, "devgate: error: an argument is not valid UTF-8");

    // `devgate help | true`: the reader is gone before devgate writes. Rust's runtime would
    // have ignored SIGPIPE; devgate's own main must too, so the write is an error it
    // handles, not a signal.
    // The read end is closed before devgate starts: closing it after the spawn raced with
    // devgate's write, which a loaded machine let win (the help fit in the pipe).
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(devgate_bin())
        .arg("help")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    // Not killed by any signal: no SIGPIPE, and no abort from a panic unwinding out of a
    // C main (the write's error ends it as Rust's own runtime would, with a code).
    assert!(
        out.status.code().is_some(),
        "{:?} {}",
        out.status,
        text(&out)
    );
    // ... and says so in devgate's one error line, not as an internal error to report.
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_one_line_error(
        &out,
        "devgate: error: cannot write stdout: broken pipe (os error 32)",
    );
}

/// `devgate hook prestart` typed at a terminal: one line saying where the state comes from,
/// instead of waiting for an end of input.
#[test]
fn a_terminal_on_stdin_is_refused_at_once() {
    use std::os::fd::FromRawFd;
    use std::process::{Command, Stdio};
    // SAFETY: plain libc calls on a fresh pseudo-terminal; every fd is owned below.
    let (master, slave) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(m)).to_owned();
        let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(s >= 0, "open pts: {}", std::io::Error::last_os_error());
        (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s))
    };
    // ^D: a devgate that read the terminal anyway gets an end of input (and a different
    // error) instead of waiting forever.
    use std::io::Write;
    (&master).write_all(b"\x04").unwrap();
    let out = Command::new(devgate_bin())
        .args(["hook", "prestart"])
        .stdin(Stdio::from(slave))
        .output()
        .unwrap();
    drop(master);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_one_line_error(
        &out,
        "devgate: error: prestart: the container state is read on stdin, which is a terminal",
    );
}

/// `devgate hook STAGE` with `stdin` as the state, given `limit` to answer: a hook that
/// blocks (on a FIFO it opened) is killed, and the test fails instead of hanging.
fn hook_within(env: &Env, stage: &str, stdin: &[u8], limit: std::time::Duration) -> Output {
    let mut child = env.hook_cmd(stage).spawn().unwrap();
    let pid = child.id() as i32;
    let mut pipe = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    std::thread::spawn(move || {
        let _ = pipe.write_all(&data);
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the child this function started; the waiting thread has
            // not reaped it, so the pid is still its own.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("devgate hook {stage} still running after {limit:?}: it blocked on an input");
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mkfifo(path: &std::path::Path) {
    let _ = fs::remove_file(path);
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// A bundle whose container is given /dev/zero (1:5), so that devgate's config and the
/// quarantine ledger are read.
fn zero_bundle(tag: &str) -> Bundle {
    let mut b = Bundle::new(tag, &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    b
}

/// A FIFO no one writes, in place of the bundle's config.json, devgate's config or a
/// quarantine entry, must not hold the hook (and so the runtime) for ever: each is opened
/// non-blocking and refused as not a regular file. The FIFO entry still quarantines.
#[test]
fn a_fifo_in_place_of_an_input_file_does_not_hold_the_hook() {
    let limit = std::time::Duration::from_secs(20);
    let env = Env::new("fifo-spec");
    let b = zero_bundle("fifo-spec");
    mkfifo(&b.dir.join("config.json"));
    let out = hook_within(&env, "prestart", b.state_json("x").as_bytes(), limit);
    assert_one_line_error(&out, "devgate: error: prestart: ");
    assert!(text(&out).contains("not a regular file"), "{}", text(&out));

    let env = Env::new("fifo-config");
    let b = zero_bundle("fifo-config");
    mkfifo(&env.config);
    let out = hook_within(&env, "prestart", b.state_json("x").as_bytes(), limit);
    assert_one_line_error(&out, "devgate: error: prestart: config");
    assert!(text(&out).contains("not a regular file"), "{}", text(&out));

    let env = Env::new("fifo-entry");
    let b = zero_bundle("fifo-entry");
    env.ok(&["cordon", "1:5", "--reason", "r"]);
    mkfifo(&env.dir.join("quarantine/c-1-5.json"));
    let out = hook_within(&env, "prestart", b.state_json("x").as_bytes(), limit);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).starts_with("devgate: rejected /dev/zero (1:5): "),
        "{}",
        text(&out)
    );
}

/// devgate's config past 1 MiB and a quarantine entry past 64 KiB are refused unread,
/// however well-formed: a huge file costs the hook no more memory than its bound. The
/// entry refused still quarantines its device.
#[test]
fn an_oversized_devgate_config_or_quarantine_entry_is_refused_unread() {
    let env = Env::new("big-config");
    let b = zero_bundle("big-config");
    let mut cfg = fs::read(&env.config).unwrap();
    cfg.splice(1..1, vec![b' '; 1 << 20]);
    fs::write(&env.config, cfg).unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_one_line_error(&out, "devgate: error: prestart: config");
    assert!(text(&out).contains("exceeds 1 MiB"), "{}", text(&out));

    let env = Env::new("big-entry");
    let b = zero_bundle("big-entry");
    env.ok(&["cordon", "1:5", "--reason", "r"]);
    let entry = env.dir.join("quarantine/c-1-5.json");
    let mut e = fs::read(&entry).unwrap();
    e.splice(1..1, vec![b' '; 64 << 10]);
    fs::write(&entry, e).unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = stderr(&out);
    assert!(
        said.starts_with("devgate: rejected /dev/zero (1:5): ") && said.contains("exceeds 64 KiB"),
        "{said}"
    );
}

/// A quarantine entry that no longer parses (a crash mid-edit, a hand edit, a tamperer who
/// can write there) still quarantines its device: the start is rejected, not let through
/// as if the ledger were clear. Uncordoning it lets the start through again.
#[test]
fn a_damaged_quarantine_entry_still_rejects_its_device() {
    let env = Env::new("damaged-entry");
    let b = zero_bundle("damaged-entry");
    env.ok(&["cordon", "1:5", "--reason", "r"]);
    fs::write(env.dir.join("quarantine/c-1-5.json"), b"{\"reason\": ").unwrap();
    let out = hook_with_stdin(&env, "prestart", b.state_json("x").as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr(&out).starts_with("devgate: rejected /dev/zero (1:5): "),
        "{}",
        text(&out)
    );
    env.ok(&["uncordon", "1:5"]);
    let out = hook_with_stdin(&env, "prestart", b.state_json("y").as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
