//! The runtime configuration files on a host (containerd's, CRI-O's, podman's, with their
//! drop-in directories, and NVIDIA's runtime's) searched for the programs of devgate's they
//! name: uninstall-host keeps a program some config still names, and install-host does not
//! change what devgate's wrapper runs under a runtime that already runs it.

use super::host_exec::under;
use std::fs;
use std::path::{Path, PathBuf};

/// The runtime configs that can name a program of devgate's: containerd's (and the
/// drop-in directory its shipped config imports), CRI-O's, podman's, and NVIDIA's runtime's,
/// whose `runtimes` list runs the wrapper in CDI mode (docs/wrapper.md). Missing one, the
/// programs it runs would be removed under it, and install-host would set runtime.path to
/// crun for a wrapper that runs runc there.
pub(super) const RUNTIME_CONFIGS: [&str; 4] = [
    "/etc/containerd",
    "/etc/crio",
    "/etc/containers",
    "/etc/nvidia-container-runtime",
];

/// The first runtime config file under `root` but those in `except` whose text names one
/// of `progs` (by its path on the host), with that program. A plain text search, so a
/// comment counts too: the programs then stay, which is the safe way to be wrong.
pub(super) fn named_by_runtime_config(
    root: &Path,
    progs: &[PathBuf],
    except: &[PathBuf],
) -> Option<(PathBuf, PathBuf)> {
    for dir in RUNTIME_CONFIGS {
        for file in config_files(&under(root, Path::new(dir))) {
            if except.contains(&file) {
                continue;
            }
            let Ok(bytes) = crate::fsutil::read_regular_file(&file, 1 << 20, "runtime config")
            else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            if let Some(p) = progs.iter().find(|p| text.contains(&*p.to_string_lossy())) {
                let shown = Path::new("/").join(file.strip_prefix(root).unwrap_or(&file));
                return Some((shown, p.clone()));
            }
        }
    }
    None
}

/// The `.toml` and `.conf` files in `dir` and in its directories one level down
/// (`conf.d`, `crio.conf.d`, `containers.conf.d`).
fn config_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => {
                if let Ok(inner) = fs::read_dir(&p) {
                    out.extend(inner.flatten().map(|e| e.path()).filter(|p| is_config(p)));
                }
            }
            Ok(t) if t.is_file() && is_config(&p) => out.push(p),
            _ => {}
        }
    }
    out.sort();
    out
}

fn is_config(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("toml" | "conf")
    )
}
