//! One error type for the crate. Every variant carries what failed and where, so the
//! single line a runtime shows (`devgate: error: ...`) is enough to act on.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A system call on a file failed.
    Io {
        what: String,
        path: PathBuf,
        source: IoCause,
    },
    /// A JSON document did not parse; line and column come from serde_json.
    Parse {
        what: String,
        path: Option<PathBuf>,
        line: usize,
        column: usize,
        msg: String,
    },
    /// An input exceeded the bound devgate reads.
    TooLarge { what: String, limit: u64 },
    /// An input parsed but holds a value devgate cannot accept.
    Invalid { what: String, msg: String },
    /// The command line was wrong.
    Usage(String),
    /// A directory or file failed the ownership/permission check.
    Unsafe { path: PathBuf, msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(what: impl Into<String>, path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            path: path.as_ref().to_path_buf(),
            source: IoCause(source),
        }
    }

    pub fn json(what: impl Into<String>, path: Option<&Path>, e: &serde_json::Error) -> Self {
        // serde_json's Display appends " at line L column C"; keep only the cause.
        let full = e.to_string();
        let cause = match full.rfind(" at line ") {
            Some(i) => &full[..i],
            None => &full,
        };
        // serde's syntax messages ("expected ident", "EOF while parsing a value") do not say
        // that the text is not JSON at all, which is the news for whoever reads the line.
        let msg = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("not valid JSON: {cause}")
            }
            _ => cause.to_string(),
        };
        Error::Parse {
            what: what.into(),
            path: path.map(Path::to_path_buf),
            line: e.line(),
            column: e.column(),
            msg,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            msg: msg.into(),
        }
    }

    pub(crate) fn unsafe_path(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Unsafe {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, path, source } => {
                write!(
                    f,
                    "{what} {}: {}",
                    path.display(),
                    lower_first(&source.to_string())
                )
            }
            Error::Parse {
                what,
                path,
                line,
                column,
                msg,
            } => {
                write!(f, "{what}")?;
                if let Some(p) = path {
                    write!(f, " {}", p.display())?;
                }
                write!(f, ": line {line} column {column}: {msg}")
            }
            Error::TooLarge { what, limit } => {
                write!(f, "{what} exceeds {}", human_bytes(*limit))
            }
            Error::Invalid { what, msg } => write!(f, "{what}: {msg}"),
            Error::Usage(msg) => write!(f, "{msg}"),
            Error::Unsafe { path, msg } => write!(f, "unsafe path {}: {msg}", path.display()),
        }
    }
}

impl std::error::Error for Error {}

/// An I/O error where the error that holds it is data too: cloned with an answer, compared
/// in a test. It prints as the `io::Error` it holds and derefs to it (`kind()`,
/// `raw_os_error()`); a clone keeps the OS error number, or else the kind and the text.
#[derive(Debug)]
pub struct IoCause(pub io::Error);

impl Clone for IoCause {
    fn clone(&self) -> Self {
        IoCause(match self.0.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(self.0.kind(), self.0.to_string()),
        })
    }
}

impl PartialEq for IoCause {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind()
            && self.0.raw_os_error() == other.0.raw_os_error()
            && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for IoCause {}

impl std::ops::Deref for IoCause {
    type Target = io::Error;
    fn deref(&self) -> &io::Error {
        &self.0
    }
}

impl From<io::Error> for IoCause {
    fn from(e: io::Error) -> Self {
        IoCause(e)
    }
}

impl fmt::Display for IoCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

pub(crate) fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    if n >= MIB && n % MIB == 0 {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n % KIB == 0 {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_names_path_and_cause_in_lower_case() {
        let e = Error::io(
            "cannot read",
            "/x/config.json",
            io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(
            e.to_string(),
            "cannot read /x/config.json: no such file or directory (os error 2)"
        );
    }

    #[test]
    fn parse_error_carries_position() {
        let err = serde_json::from_str::<serde_json::Value>("{\n  \"a\": }").unwrap_err();
        let e = Error::json("config", Some(Path::new("/etc/devgate/config.json")), &err);
        let s = e.to_string();
        assert!(
            s.starts_with("config /etc/devgate/config.json: line 2 column 8: "),
            "{s}"
        );
        assert!(!s.contains(" at line "), "{s}");
        assert!(s.ends_with(": not valid JSON: expected value"), "{s}");
        // a well-formed document with a wrong field says only the cause
        let err = serde_json::from_str::<std::collections::BTreeMap<String, u8>>(r#"{"a": "x"}"#)
            .unwrap_err();
        let s = Error::json("config", None, &err).to_string();
        assert_eq!(
            s,
            "config: line 1 column 9: invalid type: string \"x\", expected u8"
        );
    }

    #[test]
    fn an_io_cause_clones_and_compares_as_the_error_it_holds() {
        let os = IoCause::from(io::Error::from_raw_os_error(libc::EACCES));
        let copy = os.clone();
        assert_eq!(copy, os);
        assert_eq!(copy.raw_os_error(), Some(libc::EACCES));
        assert_eq!(copy.to_string(), "Permission denied (os error 13)");
        let own = IoCause::from(io::Error::new(io::ErrorKind::InvalidData, "not a number"));
        assert_eq!(own.clone(), own);
        assert_eq!(own.clone().kind(), io::ErrorKind::InvalidData);
        assert_eq!(own.to_string(), "not a number");
        assert_ne!(own, os);
        let e = Error::io(
            "cannot read",
            "/x",
            io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(e.clone(), e);
    }

    #[test]
    fn too_large_uses_units() {
        let e = Error::TooLarge {
            what: "state on stdin".into(),
            limit: 1 << 20,
        };
        assert_eq!(e.to_string(), "state on stdin exceeds 1 MiB");
    }
}
