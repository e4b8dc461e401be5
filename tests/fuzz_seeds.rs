//! Every fuzz target starts from checked-in seeds: `make fuzz` (and CI) hands libFuzzer
//! `seeds/<target>` as a corpus directory, and a target without one once failed CI.

use std::fs;
use std::path::Path;

#[test]
fn every_fuzz_target_has_seeds() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let targets: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|bin| {
            let line = bin.lines().find(|l| l.trim_start().starts_with("name"))?;
            line.split('"').nth(1)
        })
        .collect();
    assert!(targets.len() >= 10, "fuzz targets found: {targets:?}");
    for t in targets {
        let dir = fuzz.join("seeds").join(t);
        let n = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .count();
        assert!(n > 0, "{} has no seeds", dir.display());
        assert!(
            fuzz.join("fuzz_targets").join(format!("{t}.rs")).is_file(),
            "target {t} has no source"
        );
    }
}
