//! `hooks-config`, `install-host` and `uninstall-host`: the commands that lay devgate's
//! runtime configuration onto a node. This module only dispatches; the files are
//! generated in `hooks_config`, laid in `install` and taken off in `uninstall`.

use super::hooks_config::{files, write_files, Runtime};
use super::host_opts::{self, target_of, Opts};
use super::{install, out, uninstall, wrapper_config};
use crate::error::{Error, Result};

const HOOKS_CONFIG_USAGE: &str =
    "usage: devgate [--config PATH] hooks-config --runtime crio|podman|containerd \
[--wrapper] [--prefix DIR | --bin PATH] [--out DIR]";

/// The command this module runs, if `argv` names one: `hooks-config`, `install-host` or
/// `uninstall-host`.
/// Returns the exit status; `None` leaves the command line to the rest of the CLI.
pub fn cli(argv: &[String]) -> Option<i32> {
    let command = super::args::command(argv)?;
    if !["hooks-config", "install-host", "uninstall-host"].contains(&command) {
        return None;
    }
    let result = host_opts::parse(argv).and_then(|o| match o.command.as_deref() {
        Some("install-host") => install::install_host(&o),
        Some("uninstall-host") => uninstall::uninstall_host(&o),
        _ => hooks_config(&o),
    });
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "{}",
                crate::model::text::one_line(&format!("devgate: error: {e}"))
            );
            2
        }
    })
}

fn hooks_config(o: &Opts) -> Result<()> {
    if o.root.is_some() || o.config_file.is_some() || o.hooks_dir.is_some() || o.enable || o.restart
    {
        return Err(Error::Usage(format!(
            "--root, --config-file, --hooks-dir, --enable and --restart are install-host's options; {HOOKS_CONFIG_USAGE}"
        )));
    }
    let runtime =
        Runtime::parse(o.runtime.as_deref().ok_or_else(|| {
            Error::Usage(format!("--runtime is required; {HOOKS_CONFIG_USAGE}"))
        })?)?;
    let target = target_of(o, "/usr")?;
    let all = if o.wrapper {
        wrapper_config::files(runtime, &target)?
    } else {
        files(runtime, &target)?
    };
    match &o.out {
        Some(dir) => {
            for p in write_files(dir, &all)? {
                say!("{}", p.display());
            }
        }
        None => {
            for f in &all {
                if all.len() > 1 {
                    say!("# ---- {} ----", f.name);
                }
                out::write_stdout(&f.content);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use host_opts::parse;
    use std::path::Path;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_line() {
        assert_eq!(cli(&argv("status --json")), None);
        assert_eq!(cli(&argv("--config /x.json hook prestart")), None);
        let o = parse(&argv(
            "--config /c.json hooks-config --runtime=podman --prefix /opt",
        ))
        .unwrap();
        assert_eq!(o.command.as_deref(), Some("hooks-config"));
        assert_eq!(o.runtime.as_deref(), Some("podman"));
        let t = target_of(&o, "/usr").unwrap();
        assert_eq!(t.bin, Path::new("/opt/bin/devgate"));
        assert_eq!(t.config.as_deref(), Some(Path::new("/c.json")));
        assert!(parse(&argv("hooks-config --runtime")).is_err());
        assert!(parse(&argv("hooks-config --bogus x")).is_err());
        let o = parse(&argv("hooks-config --prefix /a --bin /b/devgate")).unwrap();
        assert!(target_of(&o, "/usr").is_err());
        assert!(Runtime::parse("docker").is_err());
    }

    #[test]
    fn usage_errors_are_one_line_and_name_the_wrong_option() {
        let err = |line: &str| {
            let o = parse(&argv(line)).unwrap();
            match o.command.as_deref() {
                Some("install-host") => super::super::install::install_host(&o),
                _ => hooks_config(&o),
            }
            .unwrap_err()
            .to_string()
        };
        let e = err("hooks-config");
        assert_eq!(e, format!("--runtime is required; {HOOKS_CONFIG_USAGE}"));
        let e = err("hooks-config --runtime crio --root /host");
        assert!(
            e.starts_with("--root, --config-file, --hooks-dir, --enable and --restart are install-host's options; "),
            "{e}"
        );
        let e = err("install-host");
        assert!(
            e.starts_with("--root is required; usage: devgate install-host"),
            "{e}"
        );
        let e = err("install-host --root /host --runtime crio");
        assert!(
            e.starts_with("--runtime, --bin, --out, --wrapper and --programs are not install-host's options; "),
            "{e}"
        );
        for e in [e, err("hooks-config"), err("install-host")] {
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
