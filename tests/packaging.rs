//! The packages ship the documentation: README.md, SECURITY.md and every page under docs/.
//! Cargo.toml lists each file for cargo-deb and cargo-generate-rpm; a page added to docs/
//! without its two asset lines would be missing from both packages. (CI's
//! packaging/check-packages.sh checks the built packages themselves.)

use std::fs;
use std::path::Path;

#[test]
fn every_doc_page_is_in_both_packages() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut pages: Vec<String> = fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.extend(["README.md".to_string(), "SECURITY.md".to_string()]);
    assert!(pages.len() > 2, "no pages under docs/");
    for page in &pages {
        let dest = format!("usr/share/doc/devgate/{page}");
        let dest_dir = &dest[..dest.rfind('/').unwrap() + 1];
        let deb_file = format!(r#"["{page}", "{dest}", "644"]"#);
        let deb_dir = format!(r#"["{page}", "{dest_dir}", "644"]"#);
        assert!(
            manifest.contains(&deb_file) || manifest.contains(&deb_dir),
            "Cargo.toml [package.metadata.deb] assets lack {page}: add {deb_dir}"
        );
        let rpm = format!(r#"{{ source = "{page}", dest = "/{dest}", mode = "644", doc = true }}"#);
        assert!(
            manifest.contains(&rpm),
            "Cargo.toml [package.metadata.generate-rpm] assets lack {page}: add {rpm}"
        );
    }
}
