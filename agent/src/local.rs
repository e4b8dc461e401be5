//! The node's side: devgate's config and files as the host has them, and devgate's own
//! views (`devgate status --json`, `devgate metrics`) run as the host's devgate, in the
//! host's root. The agent never judges a device itself; devgate does, with its deadlines
//! on NVML and its bounded reads.

use crate::opts::Opts;
use devgate::config::Config;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

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
            let local = PathBuf::from("/usr/local/bin/devgate");
            if under(&o.host_root, &local).exists() {
                local
            } else {
                PathBuf::from("/usr/bin/devgate")
            }
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

    fn devgate(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&self.devgate);
        if let Some(c) = &self.config_arg {
            cmd.arg("--config").arg(c);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("DEVGATE_CONFIG");
        if self.host_root != Path::new("/") {
            let root = self.host_root.clone();
            // SAFETY: chroot and chdir are async-signal-safe; nothing is allocated here.
            unsafe {
                cmd.pre_exec(move || {
                    nix::unistd::chroot(&root)?;
                    nix::unistd::chdir("/")?;
                    Ok(())
                });
            }
        }
        let what = format!("{} {}", self.devgate.display(), args.join(" "));
        run_bounded(cmd, &what)
    }
}

/// `host` below `root` (`/` leaves it as it is).
pub fn under(root: &Path, host: &Path) -> PathBuf {
    match host.strip_prefix("/") {
        Ok(rel) => root.join(rel),
        Err(_) => root.join(host),
    }
}

/// Runs `cmd` to its end or RUN_DEADLINE, whichever is first; its output bounded.
fn run_bounded(mut cmd: Command, what: &str) -> Result<String, String> {
    let mut child = cmd.spawn().map_err(|e| format!("{what}: {e}"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let r = (&mut out).take(MAX_OUTPUT + 1).read_to_end(&mut buf);
        // Drain the rest so devgate never blocks on a full pipe.
        let _ = std::io::copy(&mut out, &mut std::io::sink());
        r.map(|_| buf)
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut err).take(4096).read_to_end(&mut buf);
        let _ = std::io::copy(&mut err, &mut std::io::sink());
        buf
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > RUN_DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what}: no answer in {}s, killed",
                    RUN_DEADLINE.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    let out = reader
        .join()
        .map_err(|_| format!("{what}: reader failed"))?;
    let out = out.map_err(|e| format!("{what}: {e}"))?;
    let stderr = err_reader.join().unwrap_or_default();
    if out.len() as u64 > MAX_OUTPUT {
        return Err(format!("{what}: more than {MAX_OUTPUT} bytes of output"));
    }
    if !status.success() {
        let e = devgate::model::text::one_line(&String::from_utf8_lossy(&stderr));
        return Err(format!("{what}: {status}: {e}"));
    }
    String::from_utf8(out).map_err(|_| format!("{what}: output is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_below_the_root() {
        assert_eq!(
            under(Path::new("/"), Path::new("/run/devgate")),
            Path::new("/run/devgate")
        );
        assert_eq!(
            under(Path::new("/host"), Path::new("/run/devgate")),
            Path::new("/host/run/devgate")
        );
    }

    #[test]
    fn a_program_that_fails_says_why_and_one_that_floods_is_cut() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo 'no GPU' >&2; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let e = run_bounded(c, "sh").unwrap_err();
        assert!(e.contains("no GPU") && e.contains('3'), "{e}");
        let mut c = Command::new("sh");
        c.args(["-c", "head -c 20000000 /dev/zero"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        assert!(run_bounded(c, "sh").unwrap_err().contains("more than"));
    }
}
