//! src/ reads top to bottom in the order the data flows through a hook call, and each
//! layer imports only the layers before it. This test fails the build when a module
//! imports a later layer, when a top-level module is missing from the table, or when
//! lib.rs declares the modules out of order. docs/architecture.md explains the layers.

use std::fs;
use std::path::{Path, PathBuf};

/// Top-level module → layer. A module may use its own layer and every earlier one.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("fsutil", 0),
    ("model", 1),
    ("oci", 2),
    ("config", 3),
    ("store", 4),
    ("discover", 5),
    ("probe", 6),
    ("policy", 7),
    ("action", 8),
    ("report", 9),
    ("pipeline", 10),
    ("wrapper", 11),
    ("cli", 12),
    ("fuzzing", 13),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under src/ belongs to; None for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// Every top-level module named by a `crate::` path in `text`, grouped imports
/// (`crate::{a, b::c}`) included. Comments are skipped.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push((n + 1, name));
                    }
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push((n + 1, name));
            }
            rest = after;
        }
    }
    out
}

#[test]
fn every_module_imports_only_earlier_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for f in &files {
        let Some(module) = module_of(&src, f) else {
            continue;
        };
        let Some(own) = layer(&module) else {
            wrong.push(format!(
                "{}: module {module} is not in tests/layering.rs's table",
                f.display()
            ));
            continue;
        };
        let text = fs::read_to_string(f).unwrap();
        for (line, used) in crate_refs(&text) {
            if used == "VERSION" || used == "self" {
                continue;
            }
            match layer(&used) {
                Some(l) if l <= own => {}
                Some(l) => wrong.push(format!(
                    "{}:{line}: {module} (layer {own}) uses crate::{used} (layer {l})",
                    f.display()
                )),
                None => wrong.push(format!(
                    "{}:{line}: crate::{used} is not in tests/layering.rs's table",
                    f.display()
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn lib_declares_the_layers_in_order() {
    let lib = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("pub(crate) mod "))
                .or_else(|| l.strip_prefix("mod "))?;
            rest.strip_suffix(';')
        })
        .collect();
    let expected: Vec<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    assert_eq!(declared, expected);
}

#[test]
fn the_checker_sees_grouped_and_plain_paths() {
    let refs = crate_refs(
        "use crate::model::device::Device;\nuse crate::{cli, store::lease};\n// crate::pipeline\nlet x = crate::policy::decide(); // crate::report\n",
    );
    let names: Vec<&str> = refs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["model", "cli", "store", "policy"]);
}
