//! src/ reads top to bottom in the order the data flows through a hook call, and each
//! layer imports only the layers before it. This test fails the build when a module
//! imports a later layer, when a top-level module is missing from the table, or when
//! lib.rs declares the modules out of order. docs/architecture.md explains the layers.
//! Inside a layer too, no module imports itself through others: a file is a module, and
//! the build fails on any cycle among them (a `mod.rs` and a child that imports it back
//! included).
//!
//! It also holds the sizes the project keeps to: no file under src/ with more than
//! [`MAX_FILE_LINES`] lines of non-test code, no function longer than
//! [`MAX_SILENT_FN_LINES`] lines without a comment saying why it is long (the reason it
//! stays one piece), and no production function over [`MAX_FN_LINES`] lines at all.

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
    ("gpu", 6),
    ("probe", 7),
    ("policy", 8),
    ("action", 9),
    ("report", 10),
    ("pipeline", 11),
    ("front", 12),
    ("wrapper", 13),
    ("cli", 14),
    ("fuzzing", 15),
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
    // lib.rs and the three programs' mains (main.rs, hook_main.rs, runtime_main.rs) stand above
    // the layers.
    (!["lib", "main", "hook_main", "runtime_main"].contains(&name)).then(|| name.to_string())
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

/// A file's module path under the crate root, one granule of the module graph:
/// src/a/b.rs is `a::b`, src/a/mod.rs is `a`; None for the crate roots.
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    module_of(src, file)?;
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    Some(path)
}

/// A file's production code: `//` comments and `#[cfg(test)]` items (a `mod x;` line, or
/// everything to the closing brace at the item's indentation) removed, so tests that
/// reach back into their parent do not count as cycles.
fn production_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            let indent = &lines[i][..lines[i].len() - trimmed.len()];
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            if j < lines.len() && !lines[j].trim_end().ends_with(';') {
                let close = format!("{indent}}}");
                j = (j..lines.len()).find(|&k| lines[k] == close).unwrap_or(j);
            }
            i = j + 1;
            continue;
        }
        out.push_str(lines[i].split("//").next().unwrap_or(""));
        out.push('\n');
        i += 1;
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses the path (or `use` tree) at the start of `s` — `a::b::{c, d::{self, e}}` —
/// into its flat paths, each appended to `prefix`; returns them and the bytes read.
/// `super` drops a segment, `self` and `*` stand for the path so far.
fn parse_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let skip_space = |i: usize| i + (s[i..].len() - s[i..].trim_start().len());
    let mut path = prefix.to_vec();
    let mut i = 0;
    loop {
        i = skip_space(i);
        if s[i..].starts_with('{') {
            i += 1;
            loop {
                i = skip_space(i + parse_tree(&s[i..], &path, out));
                if !s[i..].starts_with(',') {
                    // `}`, or the end of the text
                    return i + usize::from(s[i..].starts_with('}'));
                }
                i += 1;
            }
        }
        let seg: String = s[i..]
            .chars()
            .take_while(|c| is_ident(*c) || *c == '*')
            .collect();
        i += seg.len();
        match seg.as_str() {
            "super" => {
                path.pop();
            }
            "" | "self" | "*" => {}
            _ => path.push(seg.clone()),
        }
        if seg.is_empty() || !s[i..].starts_with("::") {
            out.push(path);
            return i;
        }
        i += 2;
    }
}

/// The modules `code` (one file's, see [`production_code`]) names, as paths under the
/// crate root: every `crate::`, `super::` and `self::` path, `use` groups spread, seen
/// from the module `here`; and the children it declares with `mod x;`.
fn named_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (start, root) in [("crate::", 0), ("super::", 1), ("self::", 2)] {
        let mut from = 0;
        while let Some(k) = code[from..].find(start).map(|k| k + from) {
            from = k + start.len();
            let before = code[..k].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let prefix: Vec<String> = match root {
                0 => Vec::new(),
                1 => here[..here.len().saturating_sub(1)].to_vec(),
                _ => here.to_vec(),
            };
            parse_tree(&code[from..], &prefix, &mut out);
        }
    }
    for line in code.lines() {
        let l = line.trim_start();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub(super) "))
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(child) = l
            .strip_prefix("mod ")
            .and_then(|r| r.trim_end().strip_suffix(';'))
        {
            let mut p = here.to_vec();
            p.push(child.to_string());
            out.push(p);
        }
    }
    out
}

/// The module graph: module → the other modules its file names, each path cut to the
/// longest prefix that is a module in `known`.
type Graph = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;

fn module_graph(files: &[(Vec<String>, String)]) -> Graph {
    let known: std::collections::BTreeSet<&[String]> =
        files.iter().map(|(m, _)| m.as_slice()).collect();
    let mut graph = Graph::new();
    for (here, text) in files {
        let edges = graph.entry(here.join("::")).or_default();
        for p in named_paths(&production_code(text), here) {
            let Some(n) = (1..=p.len()).rev().find(|&n| known.contains(&p[..n])) else {
                continue;
            };
            if p[..n] != here[..] {
                edges.insert(p[..n].join("::"));
            }
        }
    }
    graph
}

/// The graph's cycles: its strongly connected components of more than one module
/// (Tarjan), each with one shortest cycle through its first module, `a → b → a`.
fn cycles(graph: &Graph) -> Vec<String> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: std::collections::BTreeMap<&'g str, (usize, usize)>,
        stack: Vec<&'g str>,
        sccs: Vec<Vec<&'g str>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                let low = match self.index.get(w) {
                    None => {
                        self.visit(w);
                        self.index[w].1
                    }
                    Some(&(i, _)) if self.stack.contains(&w) => i,
                    Some(_) => continue,
                };
                let e = self.index.get_mut(v).unwrap();
                e.1 = e.1.min(low);
            }
            if self.index[v].0 == self.index[v].1 {
                let at = self.stack.iter().rposition(|x| *x == v).unwrap();
                let mut scc = self.stack.split_off(at);
                scc.sort();
                if scc.len() > 1 {
                    self.sccs.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: Default::default(),
        stack: Vec::new(),
        sccs: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.sccs.sort();
    t.sccs
        .iter()
        .map(|scc| {
            // breadth first from scc[0] back to itself, inside the component
            let start = scc[0];
            let mut came: std::collections::BTreeMap<&str, &str> = Default::default();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = start;
            'bfs: while let Some(v) = queue.pop_front() {
                for w in graph.get(v).into_iter().flatten() {
                    let w = w.as_str();
                    if w == start {
                        last = v;
                        break 'bfs;
                    }
                    if scc.contains(&w) && !came.contains_key(w) {
                        came.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut path = vec![last];
            while let Some(&p) = came.get(*path.last().unwrap()) {
                path.push(p);
            }
            path.reverse();
            path.push(start);
            format!("{{{}}}: {}", scc.join(", "), path.join(" → "))
        })
        .collect()
}

#[test]
fn no_module_imports_itself_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let files: Vec<(Vec<String>, String)> = paths
        .iter()
        .filter_map(|f| Some((module_path(&src, f)?, fs::read_to_string(f).unwrap())))
        .collect();
    let found = cycles(&module_graph(&files));
    assert!(
        found.is_empty(),
        "import cycles between modules (a file is a module; `use super::…`, `crate::…` \
         paths and `mod x;` are its edges): move what both sides need to a leaf module, or \
         pass it in:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cycle_checker_finds_cycles_and_accepts_a_dag() {
    let file = |m: &str, text: &str| {
        let path: Vec<String> = m.split("::").map(String::from).collect();
        (path, text.to_string())
    };
    // a parent that declares a child which imports it back; two siblings through a group
    let cyclic = [
        file("model", "pub mod class;\npub mod device;\n"),
        file("model::class", "use super::device::{self, Device};\n"),
        file(
            "model::device",
            "pub fn f() {\n    crate::model::{\n        class::Class::new(),\n    };\n}\n",
        ),
        file("cli", "mod doctor;\n"),
        file("cli::doctor", "pub fn g() { super::super::cli::h() }\n"),
    ];
    assert_eq!(
        cycles(&module_graph(&cyclic)),
        [
            "{cli, cli::doctor}: cli → cli::doctor → cli",
            "{model::class, model::device}: model::class → model::device → model::class",
        ]
    );
    // the same modules without the edges back, and with tests and comments that would
    // close the cycles
    let dag = [
        file("model", "pub mod class;\npub mod device;\n"),
        file(
            "model::class",
            "use super::device::Device; // crate::model\n",
        ),
        file(
            "model::device",
            "fn f() {}\n\n#[cfg(test)]\nmod tests {\n    use super::super::class;\n}\n",
        ),
        file("cli", "mod doctor;\n#[cfg(test)]\nmod doctor_tests;\n"),
        file(
            "cli::doctor",
            "/// [`crate::cli`]\nuse crate::model::class::X;\n",
        ),
        file("cli::doctor_tests", "use crate::cli::doctor;\n"),
    ];
    assert!(cycles(&module_graph(&dag)).is_empty());
}

/// The most lines of non-test code a file under src/ may hold: the project keeps files
/// under about 400, and this leaves a little room before the build fails.
const MAX_FILE_LINES: usize = 420;

/// Past this many lines a function carries a comment saying why it is long and stays
/// one piece.
const MAX_SILENT_FN_LINES: usize = 60;

/// No production function is longer than this, whatever its comment says: past it, a
/// function is split into named steps that read as its flow.
const MAX_FN_LINES: usize = 80;

/// The functions still over [`MAX_FN_LINES`] that wait to be split (issue 23), by file
/// and name. The list only shrinks: the test fails on a function over the limit that is
/// not here, and on an entry that is no longer over it.
const NOT_YET_SPLIT: &[(&str, &str)] = &[];

/// A file's lines of non-test code: those before its `#[cfg(test)]` module (all of them
/// when it has none).
fn non_test_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .count()
}

/// Whether a trimmed line starts a function: `fn name`, after any of `pub`, `pub(…)`,
/// `const`, `async`, `unsafe` and `extern "…"`.
fn starts_fn(trimmed: &str) -> bool {
    let mut rest = trimmed;
    if let Some(r) = rest.strip_prefix("pub(") {
        rest = r.split_once(") ").map_or("", |(_, r)| r);
    } else if let Some(r) = rest.strip_prefix("pub ") {
        rest = r;
    }
    loop {
        if let Some(r) = ["const ", "async ", "unsafe "]
            .iter()
            .find_map(|q| rest.strip_prefix(q))
        {
            rest = r;
        } else if let Some(r) = rest.strip_prefix("extern \"") {
            rest = r.split_once("\" ").map_or("", |(_, r)| r);
        } else {
            break;
        }
    }
    rest.strip_prefix("fn ")
        .is_some_and(|r| r.starts_with(|c: char| c.is_alphabetic() || c == '_'))
}

/// A function longer than the limit: its first line (1-based), its name, its length from
/// the `fn` line to the closing brace at the same indentation, and whether it says why
/// it is long: a `//` line inside it, or a line of the doc comment directly above it
/// (attributes may stand between), holding the word "long" ([`says_long`]).
#[derive(Debug, PartialEq)]
struct LongFn {
    line: usize,
    name: String,
    len: usize,
    commented: bool,
}

/// Whether a comment line holds the word "long" (any case) as a word of its own: the
/// sentence that says why the function is long ("Long because …"). Any comment at all
/// let functions through whose doc comment only said what they do.
fn says_long(comment: &str) -> bool {
    comment
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| w.eq_ignore_ascii_case("long"))
}

fn long_functions(text: &str, max: usize) -> Vec<LongFn> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let trimmed = l.trim_start();
        if !starts_fn(trimmed) {
            continue;
        }
        let indent = &l[..l.len() - trimmed.len()];
        // The line that opens the body; a declaration without one (a trait's) ends in `;`.
        let Some(open) = (i..lines.len())
            .find(|&j| lines[j].contains('{') || lines[j].trim_end().ends_with(';'))
        else {
            continue;
        };
        let opener = lines[open].trim_end();
        if !opener.contains('{')
            || (opener.ends_with('}') && opener.matches('{').count() == opener.matches('}').count())
        {
            continue;
        }
        let close = format!("{indent}}}");
        let Some(end) = (open + 1..lines.len()).find(|&k| lines[k] == close) else {
            continue;
        };
        let len = end - i + 1;
        if len <= max {
            continue;
        }
        let inside = lines[i + 1..end]
            .iter()
            .map(|x| x.trim_start())
            .any(|x| x.starts_with("//") && says_long(x));
        let above = lines[..i]
            .iter()
            .rev()
            .map(|x| x.trim_start())
            .filter(|x| !x.starts_with("#["))
            .take_while(|x| x.starts_with("///"))
            .any(says_long);
        let name = trimmed.split("fn ").nth(1).unwrap_or("");
        out.push(LongFn {
            line: i + 1,
            name: name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect(),
            len,
            commented: inside || above,
        });
    }
    out
}

fn src_files() -> (PathBuf, Vec<PathBuf>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    (root.to_path_buf(), files)
}

#[test]
fn no_source_file_holds_more_than_420_lines_of_non_test_code() {
    let (root, files) = src_files();
    let over: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = non_test_lines(&fs::read_to_string(f).unwrap());
            (n > MAX_FILE_LINES).then(|| {
                format!(
                    "{}: {n} lines of non-test code",
                    f.strip_prefix(&root).unwrap().display()
                )
            })
        })
        .collect();
    assert!(
        over.is_empty(),
        "files over {MAX_FILE_LINES} lines of non-test code (the lines before \
         #[cfg(test)]); split them along the boundaries the code suggests:\n{}",
        over.join("\n")
    );
}

#[test]
fn every_function_over_60_lines_has_a_comment_saying_why() {
    let (root, files) = src_files();
    let mut silent = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        for long in long_functions(&text, MAX_SILENT_FN_LINES) {
            if !long.commented {
                silent.push(format!(
                    "{}:{}: fn {}, {} lines",
                    f.strip_prefix(&root).unwrap().display(),
                    long.line,
                    long.name,
                    long.len
                ));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "functions over {MAX_SILENT_FN_LINES} lines with no comment (a `//` line inside, \
         or a line of the doc comment above) saying why they are long, with the word \
         \"long\" (\"Long because ...\"), the reason they stay one piece:\n{}",
        silent.join("\n")
    );
}

#[test]
fn no_production_function_is_over_80_lines() {
    let (root, files) = src_files();
    let mut over = Vec::new();
    let mut waiting = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        let file = f.strip_prefix(&root).unwrap().display().to_string();
        // the code before the file's tests
        let code: String = text
            .lines()
            .take(non_test_lines(&text))
            .map(|l| format!("{l}\n"))
            .collect();
        for long in long_functions(&code, MAX_FN_LINES) {
            if NOT_YET_SPLIT.contains(&(file.as_str(), long.name.as_str())) {
                waiting.push((file.clone(), long.name));
            } else {
                over.push(format!(
                    "{file}:{}: fn {}, {} lines",
                    long.line, long.name, long.len
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines: split them into named steps:\n{}",
        over.join("\n")
    );
    let split: Vec<String> = NOT_YET_SPLIT
        .iter()
        .filter(|(f, n)| !waiting.iter().any(|(wf, wn)| wf == f && wn == n))
        .map(|(f, n)| format!("{f}: fn {n}"))
        .collect();
    assert!(
        split.is_empty(),
        "no longer over {MAX_FN_LINES} lines: take them off NOT_YET_SPLIT:\n{}",
        split.join("\n")
    );
}

#[test]
fn the_size_checks_count_as_they_say() {
    let file = "//! doc\nfn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    assert_eq!(non_test_lines(file), 3);
    assert_eq!(non_test_lines("fn a() {}\nfn b() {}\n"), 2);

    let body = |n: usize, comment: &str| {
        let mut b = String::from(comment);
        for k in 0..n {
            b.push_str(&format!("        let x{k} = {k};\n"));
        }
        b
    };
    // the signature's 3 lines, 60 lets, the `1` and the closing brace: 65
    let silent = format!(
        "impl X {{\n    pub(crate) fn long(\n        &self,\n    ) -> u32 {{\n{}        1\n    }}\n\n    fn short() {{}}\n}}\n",
        body(60, "")
    );
    let found = long_functions(&silent, 60);
    assert_eq!(
        found,
        [LongFn {
            line: 2,
            name: "long".into(),
            len: 65,
            commented: false
        }]
    );
    assert!(long_functions(&silent, 65).is_empty());
    let inside = format!(
        "fn long() {{\n{}}}\n",
        body(61, "    // long because it is a table\n")
    );
    assert!(long_functions(&inside, 60)[0].commented);
    let doc = format!(
        "/// Reads the table.\n///\n/// Long because it is a table.\n#[inline]\nunsafe extern \"C\" fn long() {{\n{}}}\n",
        body(61, "")
    );
    let found = long_functions(&doc, 60);
    assert_eq!((found[0].line, found[0].commented), (5, true));
    // a comment that does not say why it is long does not count, inside or above, nor
    // does "long" inside another word, nor a doc comment that belongs to an earlier item
    let why_not = |comment: &str, inside: &str| {
        long_functions(
            &format!("{comment}fn long() {{\n{}}}\n", body(61, inside)),
            60,
        )[0]
        .commented
    };
    assert!(!why_not(
        "/// Reads the table.\n",
        "    // one piece: it is a table\n"
    ));
    assert!(!why_not("/// Longer than most.\n", "    // belongs here\n"));
    assert!(!why_not("/// Long because.\nconst X: u8 = 1;\n", ""));
    assert!(!why_not(
        "",
        "    let long = 1; // code, not a comment line\n"
    ));
    assert!(why_not("/// LONG: a table.\n", ""));
    assert!(why_not("", "        // Long because it is a table.\n"));
    // a trait's declaration has no body; a one-line body is short
    assert!(long_functions("trait T {\n    fn f(&self);\n}\n", 0).is_empty());
    assert!(long_functions("fn f() { 1 }\nfn g() {\n}\n", 0).len() == 1);
}
