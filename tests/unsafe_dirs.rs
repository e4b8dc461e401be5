//! The attacker's test for devgate's own directories (issue 10, "Files"): a directory on
//! the way to state_dir, quarantine_dir or the log that someone else can write lets them
//! swap what root writes through. devgate refuses to write there, says why, and the
//! container's start is decided all the same.

mod common;
use common::*;
use serde_json::json;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn a_writable_ancestor_is_refused_for_records_log_and_quarantine() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let probe = tempdir("unsafe-dirs-paths");
    let open = probe.join("open");
    fs::create_dir_all(open.join("deep")).unwrap();
    // Group-writable and not sticky: any member of the group could rename `deep` away.
    fs::set_permissions(&open, fs::Permissions::from_mode(0o775)).unwrap();
    let env = Env::with(
        "unsafe-dirs",
        json!({
            "state_dir": open.join("deep/state"),
            "quarantine_dir": open.join("deep/quarantine"),
            "log_file": open.join("deep/log/decisions.jsonl"),
        }),
    );
    let mut b = Bundle::new("unsafe-dirs", &["true"]);
    b.add_device("/dev/null", "c", 1, 3);
    b.write();
    let out = env.hook_stdin("prestart", b.state_json("unsafe-1").as_bytes());
    let err = text(&out);
    assert!(
        out.status.success(),
        "the start must not depend on records: {err}"
    );
    assert!(
        err.contains("open: is writable by group or others (mode 775)"),
        "{err}"
    );
    let left: Vec<_> = fs::read_dir(open.join("deep")).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "devgate wrote below an unsafe path: {left:?}"
    );

    let cordon = env.devgate(&["cordon", "1:3", "--reason", "x"]);
    assert!(!cordon.status.success());
    assert!(
        text(&cordon).contains("writable by group or others"),
        "{}",
        text(&cordon)
    );
    assert!(!open.join("deep/quarantine").exists());

    // Made safe, the same calls write.
    fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
    let out = env.hook_stdin("prestart", b.state_json("unsafe-2").as_bytes());
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("unsafe path"), "{}", text(&out));
    assert!(open.join("deep/log/decisions.jsonl").is_file());
    env.ok(&["cordon", "1:3", "--reason", "x"]);
    fs::remove_dir_all(&probe).unwrap();
}
