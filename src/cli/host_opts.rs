//! The command line of `hooks-config`, `install-host` and `uninstall-host`, and the target
//! it names. A leaf, so each command's module takes its options from here and not from
//! `host`, which dispatches to them.

use super::hooks_config::{absolute, Target};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Options of the host commands (`host.rs`); `--config` is devgate's global option.
#[derive(Debug, Default)]
pub(crate) struct Opts {
    pub(crate) config: Option<PathBuf>,
    pub(crate) runtime: Option<String>,
    pub(crate) prefix: Option<PathBuf>,
    pub(crate) bin: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) root: Option<PathBuf>,
    pub(crate) config_file: Option<PathBuf>,
    pub(crate) hooks_dir: Option<PathBuf>,
    pub(crate) command: Option<String>,
    /// The runtime wrapper's configuration instead of the hooks' (cli/wrapper_config.rs).
    pub(crate) wrapper: bool,
    /// uninstall-host's second step: remove the programs (cli/uninstall.rs).
    pub(crate) programs: bool,
    /// install-host: also point containerd's config at the base spec (cli/install.rs).
    pub(crate) enable: bool,
    /// install-host --enable, uninstall-host: restart containerd through systemd.
    pub(crate) restart: bool,
}

pub(crate) fn parse(argv: &[String]) -> Result<Opts> {
    let p = super::args::parse(
        argv,
        &[
            "--config",
            "--runtime",
            "--prefix",
            "--bin",
            "--out",
            "--root",
            "--config-file",
            "--hooks-dir",
        ],
        &["--wrapper", "--programs", "--enable", "--restart"],
    )?;
    if let Some(extra) = p.positional.get(1) {
        return Err(Error::Usage(format!("unexpected argument {extra:?}")));
    }
    let path = |name| p.value(name).map(PathBuf::from);
    Ok(Opts {
        config: path("--config"),
        runtime: p.value("--runtime").map(str::to_string),
        prefix: path("--prefix"),
        bin: path("--bin"),
        out: path("--out"),
        root: path("--root"),
        config_file: path("--config-file"),
        hooks_dir: path("--hooks-dir"),
        command: p.positional.first().cloned(),
        wrapper: p.flag("--wrapper"),
        programs: p.flag("--programs"),
        enable: p.flag("--enable"),
        restart: p.flag("--restart"),
    })
}

/// What the hooks run, from `--bin` or `--prefix` (else `default_prefix`) and `--config`.
pub(crate) fn target_of(o: &Opts, default_prefix: &str) -> Result<Target> {
    let mut t = match (&o.bin, &o.prefix) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage("give --prefix or --bin, not both".to_string()))
        }
        (Some(b), None) => {
            absolute("--bin", b)?;
            Target::for_bin(b)
        }
        (None, Some(p)) => Target::for_prefix(p)?,
        (None, None) => Target::for_prefix(Path::new(default_prefix))?,
    };
    if let Some(c) = &o.config {
        absolute("--config", c)?;
        t.config = Some(c.clone());
    }
    Ok(t)
}
