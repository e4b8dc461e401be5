//! The runtime configuration that puts `devgate-runtime` in front of the real runtime,
//! generated for an install prefix (`devgate hooks-config --runtime R --wrapper`):
//!
//! - containerd: the runc.v2 shim's `BinaryName`, in config version 2 (containerd 1.6,
//!   1.7) and version 3 (2.x), with the base runtime spec that adds devgate's hooks (the
//!   hooks still run poststop, and skip a container the wrapper decided);
//! - CRI-O: a runtime handler whose `runtime_path` is the wrapper;
//! - podman: a containers.conf runtime (or `podman --runtime PATH`).
//!
//! The wrapper reads /etc/devgate/config.json (or DEVGATE_CONFIG): a path in a runtime
//! config cannot carry arguments, so another config file is named in the daemon's
//! environment.

use super::hooks_config::{File, Runtime, Target, CONTAINERD_BASE_SPEC_NAME};
use crate::error::Result;
use crate::wrapper::PROGRAM;
use std::path::PathBuf;

/// Where the wrapper is: `devgate-runtime` beside the devgate binary.
pub fn wrapper_path(target: &Target) -> PathBuf {
    target.bin.with_file_name(PROGRAM)
}

fn config_note(target: &Target) -> String {
    match &target.config {
        Some(c) => format!(
            "# devgate-runtime reads its config from DEVGATE_CONFIG={}: set it in the daemon's\n\
             # environment (systemd: Environment= in a drop-in for the daemon's unit).\n",
            c.display()
        ),
        None => String::new(),
    }
}

const ABOUT: &str = "\
# devgate-runtime gates each container's create and run on its devices' health, writes a
# remap to a healthy spare into the spec, then runs the runtime named by runtime.path in
# devgate's config (default runc; another wrapper such as nvidia-container-runtime works).
";

fn containerd(target: &Target, version: u32) -> File {
    let (plugin, name, which) = match version {
        2 => (
            "io.containerd.grpc.v1.cri",
            "containerd-runtime-wrapper.toml",
            "containerd 1.6 and 1.7 (config version 2)",
        ),
        _ => (
            "io.containerd.cri.v1.runtime",
            "containerd-runtime-wrapper-v3.toml",
            "containerd 2.x (config version 3)",
        ),
    };
    // Where packages, `make install` and install-host put it.
    let base = PathBuf::from("/etc/containerd").join(CONTAINERD_BASE_SPEC_NAME);
    File {
        name: name.into(),
        content: format!(
            "# devgate's OCI runtime wrapper for {which}: the runc.v2 shim runs\n\
             # devgate-runtime where it would run runc, for every container of this runtime.\n\
             {ABOUT}\
             # The base runtime spec adds devgate's hooks (poststop reports faults; prestart skips\n\
             # a container the wrapper decided). Merge into /etc/containerd/config.toml (keep\n\
             # your other options, SystemdCgroup among them) and restart containerd.\n\
             {note}\
             version = {version}\n\
             \n\
             [plugins.\"{plugin}\".containerd.runtimes.runc]\n\
             \x20 runtime_type = \"io.containerd.runc.v2\"\n\
             \x20 base_runtime_spec = \"{base}\"\n\
             \n\
             [plugins.\"{plugin}\".containerd.runtimes.runc.options]\n\
             \x20 BinaryName = \"{bin}\"\n",
            note = config_note(target),
            base = base.display(),
            bin = wrapper_path(target).display(),
        ),
    }
}

fn crio(target: &Target) -> File {
    File {
        name: "10-devgate-runtime.conf".into(),
        content: format!(
            "# devgate's OCI runtime wrapper for CRI-O: /etc/crio/crio.conf.d/10-devgate-runtime.conf.\n\
             {ABOUT}\
             # runtime_root is the state root of that runtime (runc /run/runc, crun /run/crun).\n\
             # devgate's hooks (oci/hooks.d/devgate.json) stay installed for poststop.\n\
             {note}\
             [crio.runtime]\n\
             default_runtime = \"devgate\"\n\
             \n\
             [crio.runtime.runtimes.devgate]\n\
             runtime_path = \"{bin}\"\n\
             runtime_type = \"oci\"\n\
             runtime_root = \"/run/runc\"\n",
            note = config_note(target),
            bin = wrapper_path(target).display(),
        ),
    }
}

fn podman(target: &Target) -> File {
    File {
        name: "devgate-runtime.conf".into(),
        content: format!(
            "# devgate's OCI runtime wrapper for podman: /etc/containers/containers.conf.d/\n\
             # devgate-runtime.conf, or per command: podman --runtime {bin} run ...\n\
             {ABOUT}\
             # devgate's hooks (oci/hooks.d/devgate.json) stay installed for poststop.\n\
             {note}\
             [engine]\n\
             runtime = \"devgate\"\n\
             \n\
             [engine.runtimes]\n\
             devgate = [\"{bin}\"]\n",
            note = config_note(target),
            bin = wrapper_path(target).display(),
        ),
    }
}

/// A symlink to `devgate` in the same directory (the wrapper's or the hook front's name,
/// where their own programs are not there), replacing whatever was at `link` (an older
/// link, an older copy). devgate does either's job when started by that name.
pub fn link_to_devgate(link: &std::path::Path) -> Result<()> {
    let dir = link.parent().unwrap_or(std::path::Path::new("/"));
    let name = link.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink("devgate", &tmp)
        .map_err(|e| crate::error::Error::io("cannot create", &tmp, e))?;
    std::fs::rename(&tmp, link).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        crate::error::Error::io("cannot rename into place", link, e)
    })
}

/// The wrapper's configuration for one runtime manager.
pub fn files(runtime: Runtime, target: &Target) -> Result<Vec<File>> {
    Ok(match runtime {
        Runtime::Containerd => vec![containerd(target, 2), containerd(target, 3)],
        Runtime::Crio => vec![crio(target)],
        Runtime::Podman => vec![podman(target)],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn usr() -> Target {
        Target::for_prefix(Path::new("/usr")).unwrap()
    }

    #[test]
    fn containerd_binary_name_in_both_config_versions() {
        let f = files(Runtime::Containerd, &usr()).unwrap();
        assert_eq!(f.len(), 2);
        assert!(f[0].content.contains("version = 2\n"));
        assert!(f[0]
            .content
            .contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  BinaryName = \"/usr/bin/devgate-runtime\"\n"));
        assert!(f[1].content.contains("version = 3\n"));
        assert!(f[1]
            .content
            .contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  BinaryName = \"/usr/bin/devgate-runtime\"\n"));
        for c in &f {
            assert!(c
                .content
                .contains("base_runtime_spec = \"/etc/containerd/devgate-base-spec.json\""));
        }
    }

    #[test]
    fn crio_and_podman_name_the_wrapper() {
        let t = Target {
            config: Some("/opt/dg/config.json".into()),
            ..Target::for_prefix(Path::new("/opt/dg")).unwrap()
        };
        let c = &files(Runtime::Crio, &t).unwrap()[0];
        assert!(c
            .content
            .contains("runtime_path = \"/opt/dg/bin/devgate-runtime\""));
        assert!(c.content.contains("DEVGATE_CONFIG=/opt/dg/config.json"));
        let p = &files(Runtime::Podman, &t).unwrap()[0];
        assert!(p
            .content
            .contains("devgate = [\"/opt/dg/bin/devgate-runtime\"]"));
    }

    /// The snippets shipped under hooks/ are what `hooks-config --wrapper --prefix /usr`
    /// prints: packages install them.
    #[test]
    fn shipped_snippets_match_the_generator() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks");
        for (rt, dir) in [
            (Runtime::Containerd, "containerd"),
            (Runtime::Crio, "crio"),
            (Runtime::Podman, "podman"),
        ] {
            for f in files(rt, &usr()).unwrap() {
                let p = root.join(dir).join(&f.name);
                let shipped =
                    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert_eq!(shipped, f.content, "hooks/{dir}/{}", f.name);
            }
        }
    }
}
