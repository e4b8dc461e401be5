//! doctor's node lines: devgate's directories, the cgroup mode and driver, NVML and the
//! GPUs, and each spare (its device, its /dev/char link, hidden from the device plugin).

use super::cgroup::{self, DriverVerdict, DriverVote};
use super::error::ConfigError;
use super::kubelet_checks::KubeletFile;
use super::line::Line;
use super::node;
use super::nvml::{self, NvmlAnswer};
use super::runtimes;
use crate::config::Config;
use std::path::Path;

pub(crate) fn directory_checks(config: &Config) -> Vec<Line> {
    let mut dirs = vec![
        ("state_dir", config.state_dir.clone()),
        ("quarantine_dir", config.quarantine_dir.clone()),
    ];
    if let Some(dir) = config.log_file.as_deref().and_then(Path::parent) {
        dirs.push(("log_file directory", dir.to_path_buf()));
    }
    dirs.into_iter()
        .map(|(name, dir)| match node::check_safe_dir(&dir) {
            Ok(note) => Line::pass(name, format!("{}: {note}", dir.display())),
            Err(e) => Line::fail(
                name,
                format!("{}: {e}", dir.display()),
                "make every directory on the path root's and not writable by group or \
                 others (chown root, chmod go-w), or point the config at one that is",
            ),
        })
        .collect()
}

/// The cgroup mode, and the driver kubelet's config (`kubelet`) and the runtimes (`votes`)
/// say.
pub(crate) fn cgroup_checks(
    config: &Config,
    kubelet: Option<&KubeletFile>,
    votes: Vec<DriverVote>,
) -> Vec<Line> {
    let mut lines = vec![match cgroup::read_cgroup_mode(&config.sysfs_root) {
        Ok((mode, top)) => Line::pass("cgroup mode", cgroup::describe_cgroup_mode(mode, &top)),
        Err(e) => Line::fail(
            "cgroup mode",
            e.to_string(),
            "mount the cgroup hierarchy at /sys/fs/cgroup (or set sysfs_root in the config)",
        ),
    }];
    let mut kubelet_vote = None;
    if let Some(k) = kubelet {
        match &k.text {
            Ok(t) => {
                let p = k.path.display();
                kubelet_vote = Some(match cgroup::kubelet_cgroup_driver(t) {
                    Some(d) => DriverVote {
                        source: format!("kubelet {p} cgroupDriver: {d}"),
                        driver: d,
                    },
                    None => DriverVote {
                        source: format!(
                            "kubelet {p} sets no cgroupDriver (its default is cgroupfs)"
                        ),
                        driver: "cgroupfs".into(),
                    },
                })
            }
            Err(e) => lines.push(Line::note("cgroup driver", e.to_string())),
        }
    }
    lines.push(match cgroup::decide_driver(kubelet_vote.as_ref(), &votes) {
        DriverVerdict::Unknown => Line::note(
            "cgroup driver",
            "unknown: no containerd, CRI-O or kubelet configuration says",
        ),
        DriverVerdict::Agreed(driver, how) => {
            Line::pass("cgroup driver", format!("{driver}, as {how}"))
        }
        DriverVerdict::Mixed(how) => Line::note(
            "cgroup driver",
            format!("the configurations differ ({how}); the runtime kubelet uses must match it"),
        ),
        DriverVerdict::Conflict(how) => Line::fail(
            "cgroup driver",
            format!("kubelet and the runtimes disagree ({how})"),
            "give kubelet's cgroupDriver and the runtime's setting (containerd SystemdCgroup, \
             CRI-O cgroup_manager) the same driver",
        ),
    });
    lines
}

pub(crate) fn nvml_checks(config: &Config, nvml: &NvmlAnswer) -> Vec<Line> {
    let lib = config.nvml_library.display();
    match nvml {
        NvmlAnswer::Failed { error, no_driver } => {
            if *no_driver && !nvml::has_nvidia_nodes(&config.dev_root) {
                vec![Line::note(
                    "nvml",
                    format!("no NVIDIA driver (CPU node): {error}"),
                )]
            } else {
                vec![Line::fail(
                    "nvml",
                    error.clone(),
                    "install the NVIDIA driver's NVML library (libnvidia-ml.so.1) or set \
                     nvml_library in the config to its path; an NVML that does not answer \
                     means a failing GPU or driver (look for XIDs in the kernel log)",
                )]
            }
        }
        NvmlAnswer::Gpus { driver, gpus } => {
            let mut lines = vec![Line::pass(
                "nvml",
                format!(
                    "{lib} loaded, driver {}, {} GPU(s)",
                    driver.as_deref().unwrap_or("unknown"),
                    gpus.len()
                ),
            )];
            for g in gpus {
                let check = format!("gpu {}", g.index);
                let desc = nvml::describe_gpu(g);
                lines.push(match (&g.unreachable, &g.persistence) {
                    (Some(e), _) => Line::fail(
                        check,
                        format!("NVML gives no handle: {e}"),
                        "`devgate status` and the kernel log say why; the GPU may need a \
                         reset (nvidia-smi -r) or the node a reboot",
                    ),
                    (None, Ok(true)) => Line::pass(check, format!("{desc}; persistence mode on")),
                    (None, Ok(false)) => Line::fail(
                        check,
                        format!(
                            "{desc}; persistence mode off: the driver sets the GPU up again on \
                             each container start, which can take seconds"
                        ),
                        format!(
                            "nvidia-smi -i {} -pm 1, or enable nvidia-persistenced \
                             (systemctl enable --now nvidia-persistenced)",
                            g.index
                        ),
                    ),
                    (None, Err(e)) => {
                        Line::note(check, format!("{desc}; persistence mode unknown: {e}"))
                    }
                });
            }
            lines
        }
    }
}

/// Three lines per spare: its device, its /dev/char link, and whether it is hidden from the
/// device plugin. Long because what the last needs for every spare (kubelet's checkpoint, the
/// GPUs the plugin should keep) is read once, before the loop.
pub(crate) fn spare_checks(config: &Config, config_path: &Path, nvml: &NvmlAnswer) -> Vec<Line> {
    let mut lines = Vec::new();
    let checkpoint = config
        .kubelet_pods_dir
        .parent()
        .unwrap_or(Path::new("/"))
        .join("device-plugins/kubelet_internal_checkpoint");
    let registered = match std::fs::symlink_metadata(&checkpoint) {
        Err(_) => None,
        Ok(_) => Some(runtimes::read_small(&checkpoint).and_then(|t| node::nvidia_registered(&t))),
    };
    // The GPUs the device plugin may advertise: every GPU NVML sees but the spares.
    let spare_minors: Vec<u32> = config
        .spares
        .get(crate::model::class::Class::NvidiaGpu.as_str())
        .into_iter()
        .flatten()
        .filter_map(|p| node::spare_device(p).ok())
        .map(|n| n.minor)
        .collect();
    let keep: Vec<String> = match nvml {
        NvmlAnswer::Gpus { gpus, .. } => gpus
            .iter()
            .filter(|g| g.minor.is_some_and(|m| !spare_minors.contains(&m)))
            .filter_map(|g| g.uuid.clone())
            .collect(),
        NvmlAnswer::Failed { .. } => Vec::new(),
    };
    for (class, paths) in &config.spares {
        for path in paths {
            let what = format!("{} ({class})", path.display());
            let num = match node::spare_device(path) {
                Ok(n) => n,
                Err(e) => {
                    lines.push(Line::fail(
                        "spare",
                        format!("{what}: {e}"),
                        format!(
                            "remove it from spares in {} or bring the device back",
                            config_path.display()
                        ),
                    ));
                    continue;
                }
            };
            let link = node::dev_link(&config.dev_root, num);
            let what = format!("{} ({class}, {} {num})", path.display(), num.typ.letter());
            lines.push(match node::check_dev_link(&link, num) {
                Ok(()) => Line::pass("spare", format!("{what}; {} links to it", link.display())),
                Err(e) => Line::fail(
                    "spare",
                    format!(
                        "{what}: {e}; under the systemd cgroup driver runc skips a DeviceAllow \
                         whose path is missing, so the spare is denied after a daemon-reload"
                    ),
                    node::dev_link_fix(path, &link, &config.dev_root, class),
                ),
            });
            lines.push(hidden_check(
                class,
                path,
                num,
                nvml,
                (&checkpoint, &registered),
                &keep,
            ));
        }
    }
    lines
}

/// What kubelet's checkpoint says the NVIDIA device plugin registered: None when there is no
/// checkpoint.
/// kubelet's checkpoint of the devices each plugin registered: None where it is absent.
type Registered = Option<Result<std::collections::BTreeMap<String, Vec<String>>, ConfigError>>;

/// Is the spare hidden from the device plugin? kubelet would otherwise hand the "spare"
/// to another pod. Long because each way of not knowing (not a GPU, NVML does not name it,
/// no checkpoint, an unreadable one, no NVIDIA plugin) has a note of its own saying what to
/// check by hand.
fn hidden_check(
    class: &str,
    path: &Path,
    num: crate::model::device::DevNum,
    nvml: &NvmlAnswer,
    (checkpoint, registered): (&Path, &Registered),
    keep: &[String],
) -> Line {
    let check = "spare hidden";
    if class != crate::model::class::Class::NvidiaGpu.as_str() {
        return Line::note(
            check,
            format!(
                "{} ({class}): check by hand that no device plugin or DRA driver advertises it",
                path.display()
            ),
        );
    }
    let Some((uuid, index)) = nvml_names(nvml, num.minor) else {
        return Line::note(
            check,
            format!(
                "{}: cannot tell, NVML does not name this GPU; check by hand that the NVIDIA \
                 device plugin's NVIDIA_VISIBLE_DEVICES leaves it out",
                path.display()
            ),
        );
    };
    // Where the checkpoint cannot tell, a person can: the note says how.
    let why = match registered {
        None => format!("cannot tell, {} is absent", checkpoint.display()),
        Some(Err(e)) => format!("cannot tell, {}: {e}", checkpoint.display()),
        Some(Ok(r)) if r.is_empty() => {
            "no NVIDIA device plugin is registered with kubelet".to_string()
        }
        Some(Ok(r)) => return advertised_check(path, &uuid, index, r, keep),
    };
    let by_hand = format!(
        "check by hand that the NVIDIA device plugin's container sets NVIDIA_VISIBLE_DEVICES \
         without {uuid} and runs unprivileged, or that `kubectl get resourceslices -o yaml` \
         (a DRA driver) does not list it"
    );
    Line::note(
        check,
        format!("{} ({uuid}): {why}; {by_hand}", path.display()),
    )
}

/// The UUID and index NVML gives the GPU of this minor, where it names one.
fn nvml_names(nvml: &NvmlAnswer, minor: u32) -> Option<(String, u32)> {
    match nvml {
        NvmlAnswer::Gpus { gpus, .. } => gpus
            .iter()
            .find(|g| g.minor == Some(minor))
            .and_then(|g| Some((g.uuid.clone()?, g.index))),
        NvmlAnswer::Failed { .. } => None,
    }
}

/// The spare GPU checked against the resources the NVIDIA device plugin registered with
/// kubelet: advertised, kubelet can hand it to another pod.
fn advertised_check(
    path: &Path,
    uuid: &str,
    index: u32,
    registered: &std::collections::BTreeMap<String, Vec<String>>,
    keep: &[String],
) -> Line {
    let check = "spare hidden";
    match node::advertised_as(registered, uuid, index) {
        Some(res) => Line::fail(
            check,
            format!(
                "{} ({uuid}) is advertised to kubelet as {res}: kubelet can give the spare \
                 to another pod",
                path.display()
            ),
            format!(
                "set NVIDIA_VISIBLE_DEVICES={} on the NVIDIA device plugin's container \
                 (the GPUs that are not spares), run it unprivileged (privileged, it sees \
                 every GPU), and restart it",
                keep.join(",")
            ),
        ),
        None => Line::pass(
            check,
            format!(
                "{} ({uuid}) is not among the devices the NVIDIA device plugin registered ({})",
                path.display(),
                registered.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}
