//! The one command-line parser: options that take a value (`--name VALUE` or
//! `--name=VALUE`), flags, and the words in between. Each command says which options it
//! knows; any other `--…` is an error, never silently ignored.

use crate::error::{Error, Result};
use std::path::PathBuf;

#[derive(Debug, Default)]
pub(crate) struct Parsed {
    values: Vec<(&'static str, String)>,
    flags: Vec<&'static str>,
    pub(crate) positional: Vec<String>,
}

impl Parsed {
    /// The last value given for `name`.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value given for a repeatable option, in order.
    pub(crate) fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.values
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }
}

/// The command word: the first argument that is not an option, past the global
/// `--config PATH`. Commands with options of their own look at it before the main parser.
pub(crate) fn command(argv: &[String]) -> Option<&str> {
    let mut skip_value = false;
    argv.iter()
        .find(|a| {
            if skip_value {
                skip_value = false;
                return false;
            }
            if *a == "--config" {
                skip_value = true;
            }
            !a.starts_with('-')
        })
        .map(String::as_str)
}

pub(crate) fn parse(
    argv: &[String],
    takes_value: &[&'static str],
    flags: &[&'static str],
) -> Result<Parsed> {
    let mut p = Parsed::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (arg.as_str(), None),
        };
        if let Some(&known) = takes_value.iter().find(|n| **n == name) {
            let value = match inline {
                Some(v) => v.to_string(),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| Error::Usage(format!("{name} needs a value")))?,
            };
            p.values.push((known, value));
        } else if let Some(&known) = flags.iter().find(|n| **n == arg.as_str()) {
            p.flags.push(known);
        } else if arg.starts_with("--") {
            return Err(Error::Usage(format!("unknown option {arg}")));
        } else {
            p.positional.push(arg.clone());
        }
    }
    Ok(p)
}

/// What the commands here need from the command line.
#[derive(Debug, Default)]
pub(crate) struct Args {
    pub(crate) config: Option<PathBuf>,
    pub(crate) json: bool,
    pub(crate) reason: Option<String>,
    pub(crate) textfile: Option<PathBuf>,
    pub(crate) positional: Vec<String>,
}

pub(crate) fn parse_args(argv: &[String]) -> Result<Args> {
    let p = parse(
        argv,
        &["--config", "--reason", "--textfile"],
        &["--json", "-h", "--help", "-V", "--version"],
    )?;
    let mut positional = p.positional.clone();
    if p.flag("-h") || p.flag("--help") {
        positional.insert(0, "help".into());
    } else if p.flag("-V") || p.flag("--version") {
        positional.insert(0, "version".into());
    }
    Ok(Args {
        config: p.value("--config").map(PathBuf::from),
        json: p.flag("--json"),
        reason: p.value("--reason").map(str::to_string),
        textfile: p.value("--textfile").map(PathBuf::from),
        positional,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn values_flags_and_words() {
        let p = parse(
            &argv("--config=/a.json cordon --reason x=y 195:1 --json"),
            &["--config", "--reason"],
            &["--json"],
        )
        .unwrap();
        assert_eq!(p.value("--config"), Some("/a.json"));
        assert_eq!(p.value("--reason"), Some("x=y"));
        assert!(p.flag("--json"));
        assert_eq!(p.positional, ["cordon", "195:1"]);
        let e = parse(&argv("--reason"), &["--reason"], &[]).unwrap_err();
        assert_eq!(e.to_string(), "--reason needs a value");
        let e = parse(&argv("--json=1"), &[], &["--json"]).unwrap_err();
        assert_eq!(e.to_string(), "unknown option --json=1");
    }
}
