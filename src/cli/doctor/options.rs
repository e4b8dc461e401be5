//! Where doctor looks and how its fix lines spell `hooks-config`: the values every check
//! group is handed. A leaf, so the groups import it and not `doctor`, which runs them.

use std::path::{Path, PathBuf};

/// Where doctor looks, for tests and unusual installs; each default is the node's own.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    pub(crate) config: Option<PathBuf>,
    /// The devgate the runtimes should run (default: this binary or an installed devgate).
    pub(crate) bin: Option<PathBuf>,
    /// Replace the oci-hooks directories CRI-O and podman would read.
    pub(crate) hooks_dirs: Vec<PathBuf>,
    pub(crate) crio_config: Option<PathBuf>,
    pub(crate) containerd: Option<PathBuf>,
    pub(crate) containerd_config: Option<PathBuf>,
    pub(crate) nvidia_runtime_config: Option<PathBuf>,
    pub(crate) kubelet_config: Option<PathBuf>,
}

/// How the fix lines spell `devgate hooks-config` for this node.
pub(crate) struct FixCmd {
    /// `devgate [--config PATH] hooks-config`.
    pub(crate) prefix: String,
    /// The devgate the hooks should run.
    pub(crate) bin: PathBuf,
}

impl FixCmd {
    pub(crate) fn hooks_config(&self, runtime: &str, out: &Path) -> String {
        format!(
            "{} --runtime {runtime} --bin {} --out {}",
            self.prefix,
            self.bin.display(),
            out.display()
        )
    }
}
