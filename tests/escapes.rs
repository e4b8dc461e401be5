//! Outside text is escaped wherever it is printed: ESC, CR, LF, NUL and U+202E in a device
//! path from the spec and in a cordon reason reach `explain`, `status`, the reject line
//! and the termination message only as `\xNN` / `\u{...}`.

mod common;
use common::*;
use serde_json::json;
use std::fs;

const EVIL_PATH: &str = "/dev/zz\u{1b}[2J\r\nFAKE: all devices healthy\u{202e}\0x";
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
