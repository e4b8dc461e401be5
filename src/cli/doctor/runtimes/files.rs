//! The small readers every runtime's checks share: a bounded text file, a program on
//! PATH, a TOML error on one line. A leaf, so each runtime's module imports it and not
//! `runtimes`, which declares them.

use crate::cli::doctor::error::ConfigError;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most hook files read from one directory, and the bound on each file.
pub(crate) const MAX_HOOK_FILES: usize = 1000;
pub(crate) const MAX_SMALL_FILE: u64 = 1 << 20;

/// `name` as the runtime would find it: a path as given, a bare name through PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Reads a small file, following symlinks as the runtimes do, bounded. Opened
/// non-blocking, so a FIFO planted under a config name cannot hang doctor.
pub(crate) fn read_small(path: &Path) -> Result<String, ConfigError> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ConfigError::Io(crate::error::Error::io("cannot open", path, e)))?;
    read_opened(f, path)
}

/// The text of `f`, opened as `path`: a regular file of at most [`MAX_SMALL_FILE`] bytes
/// of UTF-8. Errors name `path`.
pub(crate) fn read_opened(f: fs::File, path: &Path) -> Result<String, ConfigError> {
    let meta = f
        .metadata()
        .map_err(|e| ConfigError::Io(crate::error::Error::io("cannot stat", path, e)))?;
    if !meta.is_file() {
        return Err(ConfigError::NotRegular(path.to_path_buf()));
    }
    let mut buf = Vec::new();
    f.take(MAX_SMALL_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
    if buf.len() as u64 > MAX_SMALL_FILE {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_SMALL_FILE,
        });
    }
    String::from_utf8(buf).map_err(|_| ConfigError::NotUtf8(path.to_path_buf()))
}

/// A TOML error on one line: toml prints it over several, with the offending line quoted.
pub(crate) fn one_line_toml(e: &toml::de::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A TOML error as a [`ConfigError`], naming `path` where there is one.
pub(crate) fn toml_error(path: Option<&Path>, e: &toml::de::Error) -> ConfigError {
    ConfigError::Toml {
        path: path.map(Path::to_path_buf),
        msg: one_line_toml(e),
    }
}
