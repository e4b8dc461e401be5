//! doctor's line on the NVIDIA toolkit's config.toml: which file devgate read for the
//! default of `gpu.env_selectors`, and where it cannot know the file the toolkit reads.

use super::line::Line;
use crate::config::toolkit::{self, Reading, Says, KEY, OPERATOR_ROOT};
use crate::config::Config;
use crate::gpu::request::SWARM_RESOURCE_PREFIX;
use std::path::Path;

const CHECK: &str = "NVIDIA toolkit config";

/// The toolkit's lines for this node, from one reading of its files: which file decides
/// `gpu.env_selectors` (none where that key is set, so no file is read for it, or no file
/// the toolkit may read is there), and a `swarm-resource` devgate does not read.
pub(crate) fn toolkit_checks(config: &Config) -> Vec<Line> {
    let r = config.toolkit_reading();
    let selectors = match config.gpu.env_selectors {
        Some(_) => None,
        None => toolkit_line(&r),
    };
    selectors.into_iter().chain(swarm_line(&r)).collect()
}

/// A fail for a toolkit file whose `swarm-resource` names a variable devgate does not read
/// (only `DOCKER_RESOURCE_<KIND>` ones): the toolkit then hands over the GPUs a container
/// names by it, unchecked.
fn swarm_line(r: &Reading) -> Option<Line> {
    let unread: Vec<String> = r
        .files
        .iter()
        .filter(|(_, s)| *s != Says::Absent)
        .flat_map(|(p, _)| {
            toolkit::read_swarm_resource(p)
                .into_iter()
                .filter(|n| !is_swarm_name(n))
                .map(move |n| format!("{} names {n}", p.display()))
        })
        .collect();
    (!unread.is_empty()).then(|| {
        Line::fail(
            "NVIDIA toolkit swarm-resource",
            format!(
                "{}: the toolkit reads GPUs from it, devgate only from {SWARM_RESOURCE_PREFIX}*                  variables, so a GPU a container names by it passes unchecked",
                unread.join("; ")
            ),
            "name only DOCKER_RESOURCE_<KIND> variables in swarm-resource, or remove the key",
        )
    })
}

fn is_swarm_name(n: &str) -> bool {
    n.len() > SWARM_RESOURCE_PREFIX.len() && n.starts_with(SWARM_RESOURCE_PREFIX)
}

/// What a reading tells the operator: a file the toolkit cannot load fails; several that
/// disagree, or the GPU operator's file (its wrappers pick the toolkit's file where devgate
/// cannot see), are a note; else what the file says.
pub(crate) fn toolkit_line(r: &Reading) -> Option<Line> {
    let present: Vec<&(std::path::PathBuf, Says)> =
        r.files.iter().filter(|(_, s)| *s != Says::Absent).collect();
    if present.is_empty() && !r.explicit {
        return None;
    }
    if let Some((p, Says::Bad(why))) = present.iter().find(|(_, s)| matches!(s, Says::Bad(_))) {
        return Some(Line::fail(
            CHECK,
            format!(
                "{} {why}: NVIDIA's toolkit cannot load it; devgate takes NVIDIA_VISIBLE_DEVICES \
                 as selecting GPUs",
                p.display()
            ),
            "correct the file (TOML, the key a boolean) or remove it; the toolkit fails every \
             GPU start while it does not load",
        ));
    }
    let verdict = selects(r.env_selectors());
    if r.explicit {
        let (p, _) = &r.files[0];
        return Some(Line::pass(
            CHECK,
            format!("{} (nvidia_toolkit_config): {verdict}", p.display()),
        ));
    }
    let listed = list(&present);
    if r.disagreeing() {
        return Some(Line::note(
            CHECK,
            format!(
                "devgate cannot tell which file NVIDIA's toolkit reads: {listed}; devgate takes \
                 NVIDIA_VISIBLE_DEVICES as selecting GPUs (checks more GPUs); set \
                 nvidia_toolkit_config to the toolkit's file"
            ),
        ));
    }
    if present.iter().any(|(p, _)| is_operator(p)) {
        return Some(Line::note(
            CHECK,
            format!(
                "GPU operator install: its runtime wrappers choose the toolkit's file, which \
                 devgate cannot see; devgate reads {listed}: {verdict}; set \
                 nvidia_toolkit_config if the operator's toolkit root is not {OPERATOR_ROOT}"
            ),
        ));
    }
    Some(Line::pass(CHECK, format!("{listed}: {verdict}")))
}

fn selects(on: bool) -> &'static str {
    if on {
        "NVIDIA_VISIBLE_DEVICES selects GPUs"
    } else {
        "NVIDIA_VISIBLE_DEVICES selects GPUs for privileged containers only (the toolkit's \
         accept-nvidia-visible-devices-envvar-when-unprivileged = false)"
    }
}

/// `path says false, path sets nothing`, for the files present.
fn list(present: &[&(std::path::PathBuf, Says)]) -> String {
    present
        .iter()
        .map(|(p, s)| format!("{} {}", p.display(), says(s)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn says(s: &Says) -> String {
    match s {
        Says::Key(b) => format!("says {KEY} = {b}"),
        Says::Unset => format!("sets no {KEY} (true)"),
        Says::Absent => "is absent".into(),
        Says::Bad(why) => why.clone(),
    }
}

/// Whether `p` is the toolkit's file under the GPU operator's default root.
fn is_operator(p: &Path) -> bool {
    p.starts_with(OPERATOR_ROOT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::doctor::line::Mark;
    use std::path::PathBuf;

    fn reading(explicit: bool, files: &[(&str, Says)]) -> Reading {
        Reading {
            explicit,
            files: files
                .iter()
                .map(|(p, s)| (PathBuf::from(p), s.clone()))
                .collect(),
        }
    }

    const OP: &str = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml";
    const ETC: &str = "/etc/nvidia-container-runtime/config.toml";

    #[test]
    fn a_swarm_resource_devgate_does_not_read_fails() {
        let dir = crate::fsutil::tests::tempdir("doctor-swarm");
        let file = dir.join("config.toml");
        let mut config = Config {
            nvidia_toolkit_config: Some(file.clone()),
            ..Config::default()
        };
        assert_eq!(swarm_line(&config.toolkit_reading()), None, "no file");
        std::fs::write(&file, "swarm-resource = \"DOCKER_RESOURCE_GPU\"\n").unwrap();
        assert_eq!(
            swarm_line(&config.toolkit_reading()),
            None,
            "a name devgate reads"
        );
        std::fs::write(&file, "swarm-resource = \"DOCKER_RESOURCE_GPU,GPUS\"\n").unwrap();
        let l = swarm_line(&config.toolkit_reading()).unwrap();
        assert_eq!(l.mark, Mark::Fail);
        assert!(l.text.contains("names GPUS"), "{}", l.text);
        assert!(!l.text.contains("DOCKER_RESOURCE_GPU,"), "{}", l.text);
        config.nvidia_toolkit_config = Some(dir.join("none.toml"));
        assert_eq!(swarm_line(&config.toolkit_reading()), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_present_says_nothing() {
        assert_eq!(toolkit_line(&reading(false, &[(ETC, Says::Absent)])), None);
    }

    #[test]
    fn an_operator_install_is_a_note_naming_the_file_read() {
        assert!(is_operator(Path::new(OP)));
        let l = toolkit_line(&reading(
            false,
            &[(OP, Says::Key(false)), (ETC, Says::Absent)],
        ))
        .unwrap();
        assert_eq!(l.mark, Mark::Note);
        assert!(l.text.starts_with("GPU operator install"), "{}", l.text);
        assert!(l.text.contains(OP), "{}", l.text);
        assert!(l.text.contains("privileged containers only"), "{}", l.text);
    }

    #[test]
    fn disagreeing_files_are_one_note_agreeing_ones_pass() {
        let l = toolkit_line(&reading(
            false,
            &[(OP, Says::Key(false)), (ETC, Says::Unset)],
        ))
        .unwrap();
        assert_eq!(l.mark, Mark::Note);
        assert!(l.text.starts_with("devgate cannot tell"), "{}", l.text);
        let l = toolkit_line(&reading(false, &[(ETC, Says::Key(false))])).unwrap();
        assert_eq!(l.mark, Mark::Pass);
        assert!(!l.render().contains('\n'));
    }

    #[test]
    fn an_explicit_absent_file_passes_as_selecting() {
        let l = toolkit_line(&reading(true, &[("/x.toml", Says::Absent)])).unwrap();
        assert_eq!(l.mark, Mark::Pass);
        assert_eq!(
            l.text,
            "/x.toml (nvidia_toolkit_config): NVIDIA_VISIBLE_DEVICES selects GPUs"
        );
    }
}
