//! Outside text is escaped wherever it is printed: ESC, CR, LF and U+202E in a device
//! path from the spec and in a cordon reason reach `explain`, `status`, the reject line
//! and the termination message only as `\xNN` / `\u{...}`.

mod common;
use common::*;
use serde_json::json;
use std::fs;

// No NUL: a path holding one is refused before it is printed (crun reads only the text
// before it; oci::spec's test holds that).
const EVIL_PATH: &str = "/dev/zz\u{1b}[2J\r\nFAKE: all devices healthy\u{202e}x";
const EVIL_REASON: &str = "bad\u{1b}[2J\r\nFAKE: all devices healthy\u{202e}";

/// No raw control or bidi character, and no forged line.
fn assert_clean(what: &str, out: &str) {
    for bad in ['\u{1b}', '\r', '\0', '\u{202e}'] {
        assert!(!out.contains(bad), "{what} prints {bad:?} raw: {out:?}");
    }
    assert!(
        !out.lines().any(|l| l.trim_start().starts_with("FAKE")),
        "{what} prints a forged line: {out:?}"
    );
    assert!(out.contains("\\x1b[2J\\x0d\\x0aFAKE"), "{what}: {out:?}");
}

fn bundle_with_evil_device(env: &Env, uid: &str, term: &std::path::Path) -> Bundle {
    let mut b = Bundle::new("escapes", &["true"]);
    b.add_device(EVIL_PATH, "c", 1, 5);
    b.spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/dev/termination-log", "type": "bind", "source": term,
        "options": ["rbind", "rprivate", "rw"]
    }));
    b.spec["annotations"] = json!({"io.kubernetes.cri.sandbox-uid": uid,
                                   "io.kubernetes.cri.container-name": "app"});
    let _ = env;
    b.write();
    b
}

#[test]
fn device_path_and_cordon_reason_are_escaped_everywhere() {
    let pods = tempdir("escapes-kubelet").join("pods");
    let env = Env::with("escapes", json!({ "kubelet_pods_dir": pods }));
    let cdir = pods.join("u1/containers/app");
    fs::create_dir_all(&cdir).unwrap();
    let term = cdir.join("0badc0de");
    fs::write(&term, b"").unwrap();
    let b = bundle_with_evil_device(&env, "u1", &term);

    // a run that is admitted, then a fault during it: the termination message
    let state = b.state_json("esc-run");
    let pre = env.hook_stdin("prestart", state.as_bytes());
    assert!(pre.status.success(), "{}", text(&pre));
    env.ok(&["cordon", "1:5", "--reason", EVIL_REASON]);
    let post = env.hook_stdin("poststop", state.as_bytes());
    assert!(post.status.success(), "{}", text(&post));
    let msg = fs::read_to_string(&term).unwrap();
    assert!(msg.starts_with("devgate: DeviceFault/Cordoned"), "{msg:?}");
    assert_eq!(msg.matches('\n').count(), 1, "{msg:?}");
    assert_clean("the termination message", &msg);
    assert_clean("explain of the run", &env.ok(&["explain", "esc-run"]));

    // the device is cordoned now: the next start is rejected
    let state = b.state_json("esc-rejected");
    let pre = env.hook_stdin("prestart", state.as_bytes());
    assert!(!pre.status.success(), "{}", text(&pre));
    let reject = String::from_utf8_lossy(&pre.stderr).into_owned();
    assert_eq!(reject.trim_end().lines().count(), 1, "{reject:?}");
    assert_clean("the reject line", &reject);
    assert_clean(
        "explain of the reject",
        &env.ok(&["explain", "esc-rejected"]),
    );
    assert_clean("status", &env.ok(&["status"]));
}

/// An error about a spec's device (a path that is not absolute here) names its path: printed escaped
/// on one line, so a pod cannot forge lines in the runtime's error or kubelet's event.
#[test]
fn an_error_naming_a_spec_path_is_escaped() {
    let env = Env::with("escapes-err", json!({}));
    let mut b = Bundle::new("escapes-err", &["true"]);
    b.add_device(&EVIL_PATH[1..], "c", 1, 5);
    b.write();
    let out = env.hook_stdin("prestart", b.state_json("esc-err").as_bytes());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.starts_with("devgate: error: "), "{err:?}");
    assert_eq!(err.matches('\n').count(), 1, "{err:?}");
    assert_clean("the error line", &err);
}

/// JSON that reaches a terminal (`--json`, `cat` of a record or the decision log) carries
/// DEL, C1 controls (U+0085 ends a line on some terminals) and bidi controls only as
/// `\uXXXX`, and still reads back to the same value.
#[test]
fn json_outputs_and_files_hold_no_raw_controls() {
    const REASON: &str = "bad\u{202e}\u{85}\u{7f}\u{2028}FAKE";
    let env = Env::with("escapes-json", json!({}));
    let mut b = Bundle::new("escapes-json", &["true"]);
    b.add_device("/dev/zz\u{202e}\u{85}x", "c", 1, 5);
    b.write();
    env.ok(&["cordon", "1:5", "--reason", REASON]);
    let pre = env.hook_stdin("prestart", b.state_json("esc-json").as_bytes());
    assert!(!pre.status.success(), "{}", text(&pre));

    let raw = |c: char| {
        c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) || c == '\u{202e}' || c == '\u{2028}'
    };
    let mut outputs = vec![
        ("status --json", env.ok(&["status", "--json"])),
        ("explain --json", env.ok(&["explain", "esc-json", "--json"])),
        (
            "decision log",
            fs::read_to_string(env.dir.join("log/decisions.jsonl")).unwrap(),
        ),
    ];
    let mut stack = vec![env.dir.join("state"), env.dir.join("quarantine")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                outputs.push((
                    "a file devgate wrote",
                    fs::read_to_string(e.path()).unwrap(),
                ));
            }
        }
    }
    assert!(outputs.len() >= 5, "{outputs:?}");
    for (what, out) in &outputs {
        assert!(!out.chars().any(raw), "{what} holds a raw control: {out:?}");
    }
    // The same values come back: escaping is JSON's own, not a change of content.
    let entry = fs::read_to_string(env.dir.join("quarantine/c-1-5.json")).unwrap();
    let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
    assert_eq!(entry["reason"], REASON);
}

/// devgate's own log lines (stderr, through env_logger) are escaped as a whole: here a
/// directory the log names, when the decision log cannot be written there.
#[test]
fn log_lines_are_escaped() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("escapes-log");
    let evil = dir.join("evil\u{1b}[2J\r\nFAKE: all devices healthy\u{202e}");
    fs::create_dir(&evil).unwrap();
    fs::set_permissions(&evil, fs::Permissions::from_mode(0o777)).unwrap();
    let evil = evil.join("d.jsonl");
    let env = Env::with("escapes-log", json!({ "log_file": evil }));
    let mut b = Bundle::new("escapes-log", &["true"]);
    b.add_device("/dev/null", "c", 1, 3);
    b.write();
    let pre = env.hook_stdin("prestart", b.state_json("esc-log").as_bytes());
    assert!(pre.status.success(), "{}", text(&pre));
    let err = String::from_utf8_lossy(&pre.stderr).into_owned();
    assert!(err.contains("cannot append decision log"), "{err:?}");
    assert_clean("a log line", &err);
}
