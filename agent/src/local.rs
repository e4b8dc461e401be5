//! The node's side: devgate's config and files as the host has them, and devgate's own
//! views (`devgate status --json`, `devgate metrics`) run as the host's devgate, in the
//! host's root. The agent never judges a device itself; devgate does, with its deadlines
//! on NVML and its bounded reads.

use crate::opts::Opts;
use devgate::cli::host_exec::{output_within, program_under, run_inside, under};
use devgate::config::Config;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// What `devgate status --json` may print: far more than a node with hundreds of devices.
const MAX_OUTPUT: u64 = 16 << 20;
/// devgate's own deadlines (NVML, the kernel log) are shorter; this only bounds a devgate
/// that is stuck in the kernel.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

pub struct Local {
    pub host_root: PathBuf,
    /// devgate's config as the host reads it (its paths are the host's).
    pub config: Config,
    /// The config path to pass on, when the operator named one.
    config_arg: Option<PathBuf>,
    devgate: PathBuf,
}

/// When the files a decision changes last changed: a new stamp means "look again".
pub type Stamp = Vec<Option<(SystemTime, u64)>>;

impl Local {
    pub fn new(o: &Opts) -> Result<Local, String> {
        let host_path = o
            .devgate_config
            .clone()
            .unwrap_or_else(|| PathBuf::from("/etc/devgate/config.json"));
        let required = o.devgate_config.is_some();
        let in_here = under(&o.host_root, &host_path);
        let config = match Config::load(Some(&in_here)) {
            Ok(c) => c,
            Err(_) if !required && !in_here.exists() => Config::default(),
            Err(e) => return Err(format!("devgate's config {}: {e}", in_here.display())),
        };
        let devgate = o.devgate.clone().unwrap_or_else(|| {
            program_under(&o.host_root, &["usr/local/bin/devgate", "usr/bin/devgate"])
                .unwrap_or_else(|| PathBuf::from("/usr/bin/devgate"))
        });
        Ok(Local {
            host_root: o.host_root.clone(),
            config,
            config_arg: required.then_some(host_path),
            devgate,
        })
    }

    /// A host path as this process reaches it.
    pub fn path(&self, host: &Path) -> PathBuf {
        under(&self.host_root, host)
    }

    /// The hook's state_dir, where the agent's two files go.
    pub fn state_dir(&self) -> PathBuf {
        self.path(&self.config.state_dir)
    }

    /// The decision log and the quarantine ledger's directory: a reject or a cordon
    /// changes one of them.
    pub fn stamp(&self) -> Stamp {
        let mut watched = vec![self.path(&self.config.quarantine_dir)];
        if let Some(log) = &self.config.log_file {
            watched.push(self.path(log));
        }
        watched
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }

    /// `devgate status --json`, its output as text.
    pub fn status_json(&self) -> Result<String, String> {
        self.devgate(&["status", "--json"])
    }

    /// `devgate metrics`, Prometheus text.
    pub fn metrics_text(&self) -> Result<String, String> {
        self.devgate(&["metrics"])
    }

    /// The host's devgate with `args`, bounded in time and output: run as it is where the
    /// agent runs on the host, else through the host's systemd ([`via_systemd`]).
    fn devgate(&self, args: &[&str]) -> Result<String, String> {
        let what = format!("{} {}", self.devgate.display(), args.join(" "));
        let mut argv: Vec<&std::ffi::OsStr> = vec![self.devgate.as_os_str()];
        if let Some(c) = &self.config_arg {
            argv.extend([std::ffi::OsStr::new("--config"), c.as_os_str()]);
        }
        argv.extend(args.iter().map(std::ffi::OsStr::new));
        let mut cmd = if self.host_root == Path::new("/") {
            let mut cmd = Command::new(argv[0]);
            cmd.args(&argv[1..]).env_remove("DEVGATE_CONFIG");
            cmd
        } else {
            via_systemd(&self.host_root, &argv).map_err(|e| format!("{what}: {e}"))?
        };
        run_inside(&mut cmd, &self.host_root).map_err(|e| format!("{what}: {e}"))?;
        let out =
            output_within(cmd, RUN_DEADLINE, MAX_OUTPUT).map_err(|e| format!("{what}: {e}"))?;
        String::from_utf8(out).map_err(|_| format!("{what}: output is not UTF-8"))
    }
}

/// `argv` as a transient service of the host's systemd (`systemd-run --pipe --wait`), its
/// output on ours. In a pod the agent's container holds no device: devgate then runs as the
/// host's own process, outside the container's device cgroup, and opens /dev/nvidia*
/// (NVML) and /dev/kmsg as the hook does. A container given the devices instead would be
/// privileged, and a privileged container holds every GPU: the gate would refuse its
/// restart while any GPU is bad, which is when the agent is needed.
fn via_systemd(root: &Path, argv: &[&std::ffi::OsStr]) -> Result<Command, String> {
    if !root.join("run/systemd/system").is_dir() {
        return Err(format!(
            "{}/run/systemd/system is not there: the host does not run systemd; run \
             devgate-agent on the host instead (docs/cluster.md)",
            root.display()
        ));
    }
    let run = program_under(root, &["usr/bin/systemd-run", "bin/systemd-run"])
        .ok_or_else(|| format!("no systemd-run under {}", root.display()))?;
    let mut cmd = Command::new(run);
    cmd.args(["--quiet", "--collect", "--wait", "--pipe"])
        // The unit ends before our deadline kills systemd-run, so none is left behind.
        .arg(format!(
            "--property=RuntimeMaxSec={}",
            RUN_DEADLINE.as_secs() - 5
        ))
        .arg("--")
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // systemd's tools notice the chroot and may refuse; this chroot is the host's root.
        .env("SYSTEMD_IGNORE_CHROOT", "1");
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opts::parse;

    /// A devgate that is not there, or fails, says which program and why.
    #[test]
    fn a_devgate_that_fails_says_why() {
        let args: Vec<String> = [
            "--node-name",
            "n",
            "--devgate",
            "/bin/false",
            "--host-root",
            "/",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let local = Local::new(&parse(&args, |_| None).unwrap()).unwrap();
        let e = local.status_json().unwrap_err();
        assert!(e.starts_with("/bin/false status --json: failed"), "{e}");
        assert_eq!(
            local.path(Path::new("/run/devgate")),
            Path::new("/run/devgate")
        );
    }
}
