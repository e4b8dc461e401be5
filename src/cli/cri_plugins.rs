//! After a restart: did containerd's CRI plugin load? containerd 1.7 and 2.x stay "active"
//! under systemd when it does not (a base spec it cannot read: "failed to load base OCI
//! spec"), and kubelet then starts no pod. The host's `ctr plugins ls`, run inside the host
//! root against the socket containerd's config names, says each plugin's status.

use super::doctor::error::ConfigError;
use super::doctor::runtimes::containerd::{containerd_dump_in, parse_containerd_dump};
use super::host_exec::{self as host, RunError};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where containerd's packages and release tarballs put `ctr`.
const CTR_PROGRAMS: [&str; 3] = ["usr/bin/ctr", "usr/local/bin/ctr", "usr/sbin/ctr"];
/// containerd's socket where its config names none.
const DEFAULT_ADDRESS: &str = "/run/containerd/containerd.sock";
/// `ctr plugins ls` answers from the running daemon: seconds mean something is wrong.
const CTR_DEADLINE: Duration = Duration::from_secs(20);
/// Some tens of rows; a runaway listing is cut here.
const MAX_LISTING: u64 = 1 << 20;
/// The plugins kubelet needs, as `ctr plugins ls` names them (TYPE, ID): the CRI service,
/// and on containerd 2.x the runtime plugin it depends on (which loads the base specs),
/// checked where it is listed.
const CRI_PLUGINS: [(&str, &str, bool); 2] = [
    ("io.containerd.cri.v1", "runtime", false),
    ("io.containerd.grpc.v1", "cri", true),
];

/// Which of the CRI plugins a `ctr plugins ls` table (columns TYPE ID PLATFORMS STATUS)
/// shows not `ok`, as "TYPE ID is STATUS", or not listed where it must be.
pub(crate) fn cri_not_ok(listing: &str) -> Vec<String> {
    let rows: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() >= 4 && w[0] != "TYPE")
        .collect();
    let mut bad = Vec::new();
    for (typ, id, required) in CRI_PLUGINS {
        match rows.iter().find(|w| w[0] == typ && w[1] == id) {
            Some(w) if w[w.len() - 1] == "ok" => {}
            Some(w) => bad.push(format!("{typ} {id} is {}", w[w.len() - 1])),
            None if required => bad.push(format!("{typ} {id} is not listed")),
            None => {}
        }
    }
    bad
}

#[derive(Deserialize, Default)]
struct Grpc {
    #[serde(default)]
    address: String,
}

#[derive(Deserialize)]
struct DumpGrpc {
    #[serde(default)]
    grpc: Grpc,
}

/// containerd's socket, from its `config dump` (`[grpc] address`).
pub(crate) fn grpc_address(dump: &str) -> std::result::Result<String, CriCheckError> {
    let d: DumpGrpc =
        toml::from_str(dump).map_err(|e| CriCheckError::Address(e.message().to_string()))?;
    Ok(match d.grpc.address.trim() {
        "" => DEFAULT_ADDRESS.to_string(),
        a => a.to_string(),
    })
}

/// `ctr --address ADDR plugins ls` inside `root`.
fn plugins_ls(
    root: &Path,
    ctr: &Path,
    address: &str,
) -> std::result::Result<String, CriCheckError> {
    let mut cmd = Command::new(ctr);
    cmd.args(["--address", address, "plugins", "ls"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let shown = format!("{} --address {address} plugins ls", ctr.display());
    let failed = |run: RunError| CriCheckError::Ctr {
        shown: shown.clone(),
        run,
    };
    host::run_inside(&mut cmd, root).map_err(failed)?;
    let out = host::output_within(cmd, CTR_DEADLINE, MAX_LISTING).map_err(failed)?;
    String::from_utf8(out).map_err(|_| CriCheckError::NotUtf8 { shown })
}

/// Why containerd's CRI plugins could not be asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CriCheckError {
    /// The host root has no `ctr` program.
    NoCtr(PathBuf),
    /// containerd's dump could not be had or read.
    Config(ConfigError),
    /// The dump's `[grpc]` table is not TOML of its shape (toml's words).
    Address(String),
    /// `ctr … plugins ls` (`shown`) fell short.
    Ctr { shown: String, run: RunError },
    /// What it wrote is not UTF-8.
    NotUtf8 { shown: String },
}

impl From<ConfigError> for CriCheckError {
    fn from(e: ConfigError) -> Self {
        CriCheckError::Config(e)
    }
}

impl fmt::Display for CriCheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CriCheckError::NoCtr(root) => write!(f, "no ctr under {}", root.display()),
            CriCheckError::Config(e) => e.fmt(f),
            CriCheckError::Address(msg) => f.write_str(msg),
            CriCheckError::Ctr { shown, run } => match run {
                RunError::Spawn(e) => write!(f, "cannot run {shown}: {e}"),
                RunError::Root(_) => run.fmt(f),
                e => write!(f, "{shown} {e}"),
            },
            CriCheckError::NotUtf8 { shown } => write!(f, "{shown} wrote other than UTF-8"),
        }
    }
}

impl std::error::Error for CriCheckError {}

/// What the host's containerd at `root` (`bin`, as the host names it) lists for its CRI
/// plugins: `Ok(None)` where they loaded or the config disables them, `Ok(Some(why))`
/// where one did not, `Err` where this could not be asked.
fn cri_problem(root: &Path, bin: &Path) -> std::result::Result<Option<String>, CriCheckError> {
    let Some(ctr) = host::program_under(root, &CTR_PROGRAMS) else {
        return Err(CriCheckError::NoCtr(root.to_path_buf()));
    };
    let conf = Path::new("/etc/containerd/config.toml");
    let dump = containerd_dump_in(root, bin, Some(conf))?;
    if parse_containerd_dump(&dump)?.disabled {
        return Ok(None);
    }
    let listing = plugins_ls(root, &ctr, &grpc_address(&dump)?)?;
    let bad = cri_not_ok(&listing);
    Ok((!bad.is_empty()).then(|| bad.join(", ")))
}

/// Fails where `unit`, which systemd has running, runs a containerd whose CRI plugin did
/// not load; says one line and passes where that cannot be asked (no `ctr` on the host).
pub(super) fn check(root: &Path, bin: Option<&Path>, unit: &str) -> Result<()> {
    let Some(bin) = bin else {
        return Ok(());
    };
    match cri_problem(root, bin) {
        Ok(None) => Ok(()),
        Ok(Some(bad)) => Err(Error::invalid(
            unit,
            format!(
                "active, but its CRI plugin did not load ({bad}, says ctr plugins ls): \
                 kubelet can start no pod; containerd's log says why"
            ),
        )),
        Err(why) => {
            say!("devgate: containerd's CRI plugin could not be checked: {why}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/containerd")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn real_listings_of_containerd_1_6_and_2_1() {
        for v in ["1.6", "2.1"] {
            let ok = fixture(&format!("ctr-{v}-plugins-ok.txt"));
            assert_eq!(cri_not_ok(&ok), Vec::<String>::new(), "{v}");
        }
        let bad = fixture("ctr-1.6-plugins-cri-error.txt");
        assert_eq!(cri_not_ok(&bad), ["io.containerd.grpc.v1 cri is error"]);
        let bad = fixture("ctr-2.1-plugins-cri-error.txt");
        assert_eq!(
            cri_not_ok(&bad),
            [
                "io.containerd.cri.v1 runtime is error",
                "io.containerd.grpc.v1 cri is error"
            ]
        );
    }

    #[test]
    fn a_listing_without_the_cri_service_is_not_ok() {
        let ok = fixture("ctr-1.6-plugins-ok.txt");
        let without: String = ok
            .lines()
            .filter(|l| !l.starts_with("io.containerd.grpc.v1           cri "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(without, ok);
        assert_eq!(
            cri_not_ok(&without),
            ["io.containerd.grpc.v1 cri is not listed"]
        );
        assert_eq!(cri_not_ok(""), ["io.containerd.grpc.v1 cri is not listed"]);
        // A row with several platforms, and one in skip.
        let rows = "TYPE ID PLATFORMS STATUS\n\
                    io.containerd.grpc.v1 cri linux/amd64,linux/arm64 ok\n\
                    io.containerd.cri.v1 runtime linux/amd64 skip\n";
        assert_eq!(cri_not_ok(rows), ["io.containerd.cri.v1 runtime is skip"]);
    }

    #[test]
    fn the_socket_is_the_dumps_grpc_address() {
        for f in [
            "containerd-1.6-config-default.toml",
            "containerd-2.1-config-dump.toml",
        ] {
            assert_eq!(grpc_address(&fixture(f)).unwrap(), DEFAULT_ADDRESS, "{f}");
        }
        let own = "version = 3\n[grpc]\n  address = '/run/k3s/containerd/containerd.sock'\n";
        assert_eq!(
            grpc_address(own).unwrap(),
            "/run/k3s/containerd/containerd.sock"
        );
        assert_eq!(grpc_address("version = 2\n").unwrap(), DEFAULT_ADDRESS);
        assert_eq!(
            grpc_address("[grpc]\naddress = ''\n").unwrap(),
            DEFAULT_ADDRESS
        );
        assert!(grpc_address("[grpc\n").is_err());
    }
}
