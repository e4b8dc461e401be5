//! The runtime's command line as the wrapper reads it: runc's global options, the
//! subcommand, and the few subcommand options devgate needs (the bundle, the container id,
//! update's resources). The arguments themselves are never changed for `create` and `run`;
//! this only finds things in them.
//!
//! runc parses options Go-style: `-name` and `--name` alike, a value either as the next
//! word or after `=`, and options end at the first word that is not one (or at `--`).
//! crun takes the same long options. An option devgate does not know is taken for a
//! boolean: the runtimes' global options with values are all listed here, and an
//! unknown one would only shift which word devgate takes for the subcommand, never what
//! the runtime is given.

use std::path::{Path, PathBuf};

/// Global options that take a value (runc's, then crun's own).
const GLOBAL_VALUE: &[&str] = &[
    "root",
    "log",
    "log-format",
    "criu",
    "rootless",
    "cgroup-manager",
    "log-level",
];

/// Options of `create` and `run` that take a value (`-f`/`--config` is crun's).
const CREATE_VALUE: &[&str] = &[
    "bundle",
    "b",
    "console-socket",
    "pid-file",
    "preserve-fds",
    "pidfd-socket",
    "config",
    "f",
];

/// `delete`'s options with a value (crun's `--regex`); `--force` is a flag.
const DELETE_VALUE: &[&str] = &["regex", "r"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The global options devgate uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    pub root: Option<PathBuf>,
    pub log: Option<PathBuf>,
    pub log_format: LogFormat,
    /// `--systemd-cgroup` (runc) or `--cgroup-manager=systemd` (crun): the runtime hands
    /// the device policy to systemd.
    pub systemd_cgroup: bool,
}

/// What `create` or `run` will create: the bundle, the spec file in it, the container id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Create {
    pub bundle: PathBuf,
    /// The spec file: `config.json` in the bundle, or crun's `--config FILE`.
    pub spec_file: PathBuf,
    pub id: Option<String>,
}

/// Where `update` reads the new resources from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resources {
    Stdin,
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub resources: Option<Resources>,
    /// The index in the full argument list of the word that holds the resources' file
    /// name (`FILE`, `--resources=FILE` or `-r=FILE`), for replacing it.
    pub resources_at: Option<usize>,
    /// The prefix of that word before the file name (`--resources=` or empty).
    pub resources_prefix: String,
    pub id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Create(Create),
    Run(Create),
    Update(Update),
    Delete {
        id: Option<String>,
    },
    /// Everything else (`start`, `kill`, `state`, `features`, …) and no subcommand at all.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub global: Global,
    pub command: Command,
    /// The subcommand as given, if any.
    pub name: Option<String>,
}

/// One option word: its name without dashes and an inline `=value`.
struct Opt<'a> {
    name: &'a str,
    inline: Option<&'a str>,
}

fn option(word: &str) -> Option<Opt<'_>> {
    let body = word.strip_prefix("--").or_else(|| word.strip_prefix('-'))?;
    if body.is_empty() || word == "--" {
        return None;
    }
    Some(match body.split_once('=') {
        Some((name, v)) => Opt {
            name,
            inline: Some(v),
        },
        None => Opt {
            name: body,
            inline: None,
        },
    })
}

/// Options and the first operand after `start`, Go-style. `takes_value` says which
/// options consume the next word. Returns (options with their value and the index of the
/// word holding it, index of the first operand).
#[allow(clippy::type_complexity)]
fn scan<'a>(
    args: &'a [String],
    start: usize,
    takes_value: &dyn Fn(&str) -> bool,
) -> (Vec<(&'a str, Option<&'a str>, usize)>, Option<usize>) {
    let mut opts = Vec::new();
    let mut i = start;
    while i < args.len() {
        let w = args[i].as_str();
        if w == "--" {
            return (opts, (i + 1 < args.len()).then_some(i + 1));
        }
        let Some(o) = option(w) else {
            return (opts, Some(i));
        };
        match o.inline {
            Some(v) => opts.push((o.name, Some(v), i)),
            None if takes_value(o.name) => {
                opts.push((o.name, args.get(i + 1).map(String::as_str), i + 1));
                i += 1;
            }
            None => opts.push((o.name, None, i)),
        }
        i += 1;
    }
    (opts, None)
}

/// Reads the runtime's arguments (everything after the program name). `cwd` resolves a
/// relative or absent bundle, as the runtime itself does.
pub fn parse(args: &[String], cwd: &Path) -> Invocation {
    let (globals, sub) = scan(args, 0, &|n| GLOBAL_VALUE.contains(&n));
    let mut global = Global {
        root: None,
        log: None,
        log_format: LogFormat::Text,
        systemd_cgroup: false,
    };
    for (name, value, _) in globals {
        match (name, value) {
            ("systemd-cgroup", v) => global.systemd_cgroup = !matches!(v, Some("false")),
            ("cgroup-manager", Some(v)) => global.systemd_cgroup = v == "systemd",
            ("root", Some(v)) => global.root = Some(PathBuf::from(v)),
            ("log", Some(v)) => global.log = Some(PathBuf::from(v)),
            ("log-format", Some(v)) => {
                global.log_format = if v == "json" {
                    LogFormat::Json
                } else {
                    LogFormat::Text
                }
            }
            _ => {}
        }
    }
    let Some(sub) = sub else {
        return Invocation {
            global,
            command: Command::Other,
            name: None,
        };
    };
    let name = args[sub].clone();
    let command = match name.as_str() {
        "create" => Command::Create(create(args, sub + 1, cwd)),
        "run" => Command::Run(create(args, sub + 1, cwd)),
        "update" => Command::Update(update(args, sub + 1)),
        "delete" => {
            let (_, id) = scan(args, sub + 1, &|n| DELETE_VALUE.contains(&n));
            Command::Delete {
                id: id.map(|i| args[i].clone()),
            }
        }
        _ => Command::Other,
    };
    Invocation {
        global,
        command,
        name: Some(name),
    }
}

fn create(args: &[String], start: usize, cwd: &Path) -> Create {
    let (opts, id) = scan(args, start, &|n| CREATE_VALUE.contains(&n));
    let mut bundle = None;
    let mut config = None;
    for (name, value, _) in opts {
        match (name, value) {
            ("bundle" | "b", Some(v)) => bundle = Some(v),
            ("config" | "f", Some(v)) => config = Some(v),
            _ => {}
        }
    }
    // An empty --bundle is the current directory too (runc: `if bundle != ""`).
    let bundle = match bundle.filter(|b| !b.is_empty()) {
        Some(b) => cwd.join(b),
        None => cwd.to_path_buf(),
    };
    let spec_file = bundle.join(config.unwrap_or("config.json"));
    Create {
        bundle,
        spec_file,
        id: id.map(|i| args[i].clone()),
    }
}

/// Every option of `update` takes a value (runc's and crun's alike).
fn update(args: &[String], start: usize) -> Update {
    let (opts, id) = scan(args, start, &|_| true);
    let mut u = Update {
        resources: None,
        resources_at: None,
        resources_prefix: String::new(),
        id: id.map(|i| args[i].clone()),
    };
    for (name, value, at) in opts {
        if !matches!(name, "resources" | "r") {
            continue;
        }
        let Some(v) = value else { continue };
        u.resources = Some(if v == "-" {
            Resources::Stdin
        } else {
            Resources::File(PathBuf::from(v))
        });
        u.resources_at = Some(at);
        u.resources_prefix = args[at]
            .strip_suffix(v)
            .filter(|p| p.ends_with('='))
            .unwrap_or("")
            .to_string();
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn p(s: &str) -> Invocation {
        parse(&argv(s), Path::new("/cwd"))
    }

    /// What containerd's runc.v2 shim (go-runc) passes to `create`.
    #[test]
    fn shim_create_with_every_global_option() {
        let inv = p(
            "--root /run/containerd/runc/k8s.io --log /run/b/log.json --log-format json \
                     --systemd-cgroup --criu /usr/sbin/criu --rootless=false --debug \
                     create --bundle /run/b --pid-file /run/b/init.pid \
                     --console-socket /tmp/pty.sock --preserve-fds 2 c0ffee",
        );
        assert_eq!(
            inv.global,
            Global {
                root: Some("/run/containerd/runc/k8s.io".into()),
                log: Some("/run/b/log.json".into()),
                log_format: LogFormat::Json,
                systemd_cgroup: true,
            }
        );
        assert_eq!(inv.name.as_deref(), Some("create"));
        assert_eq!(
            inv.command,
            Command::Create(Create {
                bundle: "/run/b".into(),
                spec_file: "/run/b/config.json".into(),
                id: Some("c0ffee".into()),
            })
        );
    }

    #[test]
    fn equals_forms_and_single_dashes() {
        let inv = p("-root=/r --log=/l.json -log-format=json --rootless auto run -b=/b --detach x");
        assert_eq!(inv.global.root.as_deref(), Some(Path::new("/r")));
        assert_eq!(inv.global.log.as_deref(), Some(Path::new("/l.json")));
        assert_eq!(inv.global.log_format, LogFormat::Json);
        match inv.command {
            Command::Run(c) => {
                assert_eq!(c.bundle, Path::new("/b"));
                assert_eq!(c.id.as_deref(), Some("x"));
            }
            c => panic!("{c:?}"),
        }
        // --rootless with a separate value: the value is not the subcommand
        let inv = p("--rootless false create id");
        assert_eq!(inv.name.as_deref(), Some("create"));
        assert!(!inv.global.systemd_cgroup);
        assert!(!p("--systemd-cgroup=false create id").global.systemd_cgroup);
        assert!(
            p("--cgroup-manager=systemd create id")
                .global
                .systemd_cgroup
        );
        assert!(
            !p("--cgroup-manager cgroupfs create id")
                .global
                .systemd_cgroup
        );
    }

    #[test]
    fn bundle_defaults_to_cwd_and_relative_is_under_it() {
        for (line, bundle) in [
            ("create id", "/cwd"),
            ("create --bundle= id", "/cwd"),
            ("create -b sub/dir id", "/cwd/sub/dir"),
            ("create --bundle /abs id", "/abs"),
        ] {
            match p(line).command {
                Command::Create(c) => {
                    assert_eq!(c.bundle, Path::new(bundle), "{line}");
                    assert_eq!(c.spec_file, Path::new(bundle).join("config.json"));
                    assert_eq!(c.id.as_deref(), Some("id"), "{line}");
                }
                c => panic!("{line}: {c:?}"),
            }
        }
    }

    #[test]
    fn crun_config_option_names_the_spec_file() {
        match p("create --bundle /b --config other.json id").command {
            Command::Create(c) => assert_eq!(c.spec_file, Path::new("/b/other.json")),
            c => panic!("{c:?}"),
        }
        match p("create -f /elsewhere/c.json id").command {
            Command::Create(c) => assert_eq!(c.spec_file, Path::new("/elsewhere/c.json")),
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn double_dash_ends_options() {
        match p("create -b /b -- --odd-id").command {
            Command::Create(c) => assert_eq!(c.id.as_deref(), Some("--odd-id")),
            c => panic!("{c:?}"),
        }
        match p("create -b /b").command {
            Command::Create(c) => assert_eq!(c.id, None),
            c => panic!("{c:?}"),
        }
    }

    /// containerd 2.x asks `<BinaryName> features` with no global options.
    #[test]
    fn features_and_others_pass() {
        let inv = p("features");
        assert_eq!(inv.name.as_deref(), Some("features"));
        assert_eq!(inv.command, Command::Other);
        assert_eq!(inv.global.log, None);
        for line in [
            "--root /r start id",
            "kill id 9",
            "state id",
            "--version",
            "",
        ] {
            assert_eq!(p(line).command, Command::Other, "{line}");
        }
        assert_eq!(p("--version").name, None);
    }

    #[test]
    fn update_resources_from_stdin_or_a_file() {
        let u = match p("--root /r --log /l update --resources - id1").command {
            Command::Update(u) => u,
            c => panic!("{c:?}"),
        };
        assert_eq!(u.resources, Some(Resources::Stdin));
        assert_eq!(u.id.as_deref(), Some("id1"));
        let args = argv("update --cpu-share 2 --resources=/tmp/r.json id2");
        let u = match parse(&args, Path::new("/")).command {
            Command::Update(u) => u,
            c => panic!("{c:?}"),
        };
        assert_eq!(u.resources, Some(Resources::File("/tmp/r.json".into())));
        assert_eq!(u.resources_at, Some(3));
        assert_eq!(u.resources_prefix, "--resources=");
        assert_eq!(u.id.as_deref(), Some("id2"));
        let args = argv("update -r /tmp/r.json id3");
        let u = match parse(&args, Path::new("/")).command {
            Command::Update(u) => u,
            c => panic!("{c:?}"),
        };
        assert_eq!(u.resources_at, Some(2));
        assert_eq!(u.resources_prefix, "");
        let u = match p("update --memory 1g id4").command {
            Command::Update(u) => u,
            c => panic!("{c:?}"),
        };
        assert_eq!(u.resources, None);
        assert_eq!(u.id.as_deref(), Some("id4"));
    }

    #[test]
    fn delete_id_after_force() {
        assert_eq!(
            p("--root /r delete --force id").command,
            Command::Delete {
                id: Some("id".into())
            }
        );
        assert_eq!(p("delete").command, Command::Delete { id: None });
    }
}
