//! kubelet's side of a container's end, as its sources do it, for CRI tests to assert what
//! `kubectl describe pod` shows rather than what a file holds:
//! - kuberuntime_container.go `getTerminationMessage`: the last 4096 bytes of the host file
//!   of the termination-message mount (`tail.ReadAtMost`), and whether to read the logs
//!   instead (FallbackToLogsOnError, a non-zero exit, an empty file);
//! - `readLastStringFromContainerLogs`: the log's last 80 lines, at most 2048 bytes;
//! - `getContainerStatus`: the runtime's message, then ": ", then that text;
//! - status_manager.go `normalizeStatus`: the first 12288 / (containers + init containers)
//!   bytes of each terminated state's message;
//! - a crashed container of a `restartPolicy: Always` pod is created again (attempt + 1)
//!   about 1 s after its exit (the first back-off step is 10 s, but the first restart is
//!   immediate).

use super::cri::{self, ContainerStatus};
use super::*;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

/// MaxContainerTerminationMessageLength.
pub const FILE_LIMIT: u64 = 4096;
/// MaxPodTerminationMessageLogLength.
pub const POD_LIMIT: usize = 12288;
/// MaxContainerTerminationMessageLogLines and MaxContainerTerminationMessageLogLength.
pub const LOG_LINES: usize = 80;
pub const LOG_LIMIT: usize = 2048;
/// How long after an exit kubelet starts the container again, in these tests.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);

/// The annotations kubelet puts on every container it creates (labels.go).
pub const PATH_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePath";
pub const POLICY_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const TERMINATION_PATH: &str = "/dev/termination-log";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    File,
    FallbackToLogsOnError,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::File => "File",
            Policy::FallbackToLogsOnError => "FallbackToLogsOnError",
        }
    }
}

/// The stack these tests run on, by the node's OS release: only what it names is known.
pub fn stack() -> String {
    let os = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .unwrap_or("unknown")
        .trim_matches('"')
        .to_string();
    eprintln!("kubelet emulation on the {codename} stack");
    codename
}

/// The last `FILE_LIMIT` bytes of `path`, as `tail.ReadAtMost` reads them.
pub fn file_tail(path: &Path) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len.saturating_sub(FILE_LIMIT)))
        .unwrap();
    let mut out = Vec::new();
    f.read_to_end(&mut out).unwrap();
    out
}

/// The text of a CRI log (`<time> <stream> <P|F> <text>` lines): the last `LOG_LINES`
/// lines, of which the last `LOG_LIMIT` bytes (readLastStringFromContainerLogs reads the
/// tail into a circbuf of that size, which keeps the newest bytes).
pub fn log_tail(path: &Path) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
    let mut text = String::new();
    let lines: Vec<&str> = log.lines().collect();
    for l in &lines[lines.len().saturating_sub(LOG_LINES)..] {
        let mut parts = l.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next());
        text.push_str(msg.unwrap_or(""));
        if tag != Some("P") {
            text.push('\n');
        }
    }
    let mut cut = text.len().saturating_sub(LOG_LIMIT);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    text.split_off(cut)
}

/// The termination-message file's host path: the mount whose container path is the
/// termination-message path.
pub fn host_file(status: &ContainerStatus) -> PathBuf {
    let m = status
        .mounts
        .iter()
        .find(|m| m.container_path == TERMINATION_PATH)
        .unwrap_or_else(|| panic!("no {TERMINATION_PATH} mount in {status:?}"));
    PathBuf::from(&m.host_path)
}

/// What kubelet puts in an exited container's terminated state (`getContainerStatus`):
/// the runtime's message, ": ", and the termination message or, for FallbackToLogsOnError
/// with a non-zero exit (not ContainerCannotRun) and an empty file, the log's tail.
pub fn terminated_message(status: &ContainerStatus, policy: Policy) -> String {
    let fallback = policy == Policy::FallbackToLogsOnError
        && status.exit_code != 0
        && status.reason != "ContainerCannotRun";
    let data = file_tail(&host_file(status));
    let text = if fallback && data.is_empty() {
        log_tail(Path::new(&status.log_path))
    } else {
        String::from_utf8_lossy(&data).into_owned()
    };
    let mut message = status.message.clone();
    if !text.is_empty() {
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// The status manager's cut (`normalizeStatus`): the first 12288 / `containers` bytes.
pub fn status_share(message: &str, containers: usize) -> String {
    let share = POD_LIMIT / containers.max(1);
    let bytes = message.as_bytes();
    String::from_utf8_lossy(&bytes[..bytes.len().min(share)]).into_owned()
}

/// What `kubectl describe pod` shows as the message of an exited container of a pod of
/// `containers` containers.
pub fn describe_message(status: &ContainerStatus, policy: Policy, containers: usize) -> String {
    status_share(&terminated_message(status, policy), containers)
}

/// A pod as kubelet sets it up for containerd: its sandbox, and for each container the
/// termination-message file under `<kubelet pods>/<uid>/containers/<name>/` mounted at the
/// termination-message path, with kubelet's path and policy annotations.
pub struct Pod {
    pub id: String,
    pub config: cri::PodSandboxConfig,
    pub uid: String,
    pub kubelet_pods: PathBuf,
}

impl Pod {
    pub fn run(c: &mut cri::Cri, name: &str, uid: &str, work: &Path, kubelet_pods: &Path) -> Pod {
        // kubelet's pod log directory: `<namespace>_<pod name>_<uid>` (BuildPodLogsDirectory).
        let logs = work.join("pods").join(format!("ml_{name}_{uid}"));
        let config = cri::host_network_pod(name, uid, "ml", &logs);
        let id = c
            .run_pod_sandbox(&config)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"));
        Pod {
            id,
            config,
            uid: uid.into(),
            kubelet_pods: kubelet_pods.to_path_buf(),
        }
    }

    /// Attempt `attempt` of container `name`: a fresh termination file per attempt, as
    /// kubelet makes one per container it creates.
    pub fn container(
        &self,
        name: &str,
        attempt: u32,
        policy: Policy,
        command: &[&str],
    ) -> cri::ContainerConfig {
        let dir = self
            .kubelet_pods
            .join(&self.uid)
            .join("containers")
            .join(name);
        fs::create_dir_all(&dir).unwrap();
        let term = dir.join(format!("term-{attempt}"));
        fs::write(&term, "").unwrap();
        let mut c = cri::container(name, TEST_IMAGE, command, &["/dev/zero"]);
        c.metadata.as_mut().unwrap().attempt = attempt;
        c.log_path = format!("{name}/{attempt}.log");
        c.mounts.push(cri::Mount {
            container_path: TERMINATION_PATH.into(),
            host_path: term.display().to_string(),
            ..Default::default()
        });
        c.annotations
            .insert(PATH_ANNOTATION.into(), TERMINATION_PATH.into());
        c.annotations
            .insert(POLICY_ANNOTATION.into(), policy.name().into());
        c
    }
}

/// Polls ContainerStatus until the container has exited (or 30 s, then the last status).
pub fn wait_exited(c: &mut cri::Cri, id: &str) -> ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.container_status(id).unwrap();
        if st.state == cri::ContainerState::ContainerExited as i32 || Instant::now() > deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until devgate's poststop for container `id` has written its exit record (it
/// runs when containerd deletes the task, just after the exit is reported).
pub fn wait_poststop(env: &Env, id: &str) {
    wait_for(&format!("the exit record of {id}"), || {
        env.dir
            .join("state/exits")
            .join(format!("{id}.json"))
            .exists()
    });
}
