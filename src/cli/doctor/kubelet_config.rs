//! A KubeletConfiguration file, read for the one key devgate compares (`podLogsDir`) and
//! its `kind`: JSON, or YAML read line by line at the top level. What kubelet's YAML
//! parser would read otherwise than this reader (a value below its key, an anchor, a tag,
//! a flow collection, an odd line break) is refused with what is wrong, never guessed at.

/// What a KubeletConfiguration file says of the pod logs directory: None where it leaves
/// `podLogsDir` unset; Some("") where it sets it null or empty. The two differ in a
/// drop-in, which kubelet merges as a JSON merge patch: null there removes the file's
/// podLogsDir, and kubelet's defaulting then makes an empty one /var/log/pods.
pub(crate) fn parse_config(text: &str) -> Result<Option<String>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let keys = if text.trim_start().starts_with('{') {
        json_keys(text)?
    } else {
        yaml_keys(text)?
    };
    let mut kind = None;
    let mut logs = None;
    for (k, v) in keys {
        let slot = match k.as_str() {
            "kind" => &mut kind,
            "podLogsDir" => &mut logs,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("{k} is set twice"));
        }
        *slot = Some(v);
    }
    match kind.flatten() {
        None => {}
        Some(k) if k == "KubeletConfiguration" => {}
        Some(k) => return Err(format!("kind {k:?} is not KubeletConfiguration")),
    }
    Ok(logs.map(Option::unwrap_or_default))
}

/// A JSON object's `kind` and `podLogsDir`: Some(text) for a string, None for null.
fn json_keys(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let mut out = Vec::new();
    for k in ["kind", "podLogsDir"] {
        match map.get(k) {
            None => {}
            Some(serde_json::Value::Null) => out.push((k.to_string(), None)),
            Some(serde_json::Value::String(s)) => out.push((k.to_string(), Some(s.clone()))),
            Some(_) => return Err(format!("{k} is not a string")),
        }
    }
    Ok(out)
}

/// The keys of a YAML document's top-level mapping, each with its scalar (None: null, or a
/// block below it). kubelet's configs are flat at the top where devgate reads them, so
/// this reads only lines that start at column 0 and skips the indented ones of other keys.
/// An indented line that would be part of `kind`'s or `podLogsDir`'s value (YAML lets it
/// sit below its key, or a plain scalar go on there), or an indented top-level mapping, is
/// refused: skipping it would read a value other than kubelet's.
fn yaml_keys(text: &str) -> Result<Vec<(String, Option<String>)>, String> {
    // kubelet's go-yaml breaks lines at a lone CR, NEL, LS and PS as well: a key behind
    // one would be a line of its own there, and part of another key's value here.
    let lone_cr = text
        .char_indices()
        .any(|(i, c)| c == '\r' && !text[i + 1..].starts_with('\n'));
    if lone_cr || text.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return Err("a line break devgate does not read (a lone CR, NEL, LS or PS)".into());
    }
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut documents = 0;
    for (n, line) in text.lines().enumerate() {
        let first = line.chars().next();
        if matches!(first, None | Some(' ' | '\t' | '#' | '-' | '%')) {
            // A document start, after a document that had keys, is a second document.
            if line.starts_with("---") {
                documents += 1;
                if documents > 1 || !out.is_empty() {
                    return Err("holds more than one YAML document".into());
                }
                continue;
            }
            below_a_key(line, n, out.last().map(|(k, _)| k.as_str()))?;
            continue;
        }
        if line.starts_with("...") {
            break;
        }
        let (key, rest) = top_level_key(line, n)?;
        // A key devgate does not read may hold an empty flow collection (`[]`, `{}`), as
        // generated configs write them; it cannot span lines, so it hides no key.
        if !matches!(key.as_str(), "kind" | "podLogsDir") && empty_flow(rest) {
            continue;
        }
        let value = yaml_scalar(rest).map_err(|e| format!("{key}: {e}"))?;
        out.push((key, value));
    }
    Ok(out)
}

/// A line that is not a top-level key (line `n`, after the key `last`): content there
/// (indented, or a block sequence's `-`) is part of that key's value, which is refused for
/// the keys devgate reads, and before any key is an indented top-level mapping. Blank and
/// comment lines are nothing.
fn below_a_key(line: &str, n: usize, last: Option<&str>) -> Result<(), String> {
    let body = line.trim_start_matches([' ', '\t']);
    let content = match line.chars().next() {
        Some(' ' | '\t') => !body.is_empty() && !body.starts_with('#'),
        Some('-') => true,
        _ => false,
    };
    match last {
        _ if !content => Ok(()),
        None => Err(format!(
            "line {}: an indented top-level mapping, which devgate does not read",
            n + 1
        )),
        Some(k) if matches!(k, "kind" | "podLogsDir") => Err(format!(
            "{k}: a value on the lines below, which devgate does not read"
        )),
        Some(_) => Ok(()),
    }
}

/// `key: rest` of top-level line `n`, or why devgate does not read it: a flow collection at
/// the top (JSON behind a comment, or YAML's `{a: 1, ...}`: its keys are the document's, on
/// any of its lines); an anchor, tag or alias before a key, or an escape in its double
/// quotes (YAML reads the key behind it, which devgate would miss).
fn top_level_key(line: &str, n: usize) -> Result<(String, &str), String> {
    if line.starts_with(['{', '[']) {
        return Err(format!(
            "line {}: a flow collection, which devgate does not read",
            n + 1
        ));
    }
    let escaped_key = line
        .strip_prefix('"')
        .is_some_and(|k| k[..k.find('"').unwrap_or(k.len())].contains('\\'));
    if line.starts_with(['&', '!', '*']) || escaped_key {
        return Err(format!(
            "line {}: a key devgate does not read (an escape, anchor, tag or alias)",
            n + 1
        ));
    }
    yaml_key(line).ok_or_else(|| format!("line {}: not `key: value`", n + 1))
}

/// `[]` or `{}`, then nothing but blanks or a comment.
fn empty_flow(rest: &str) -> bool {
    let v = rest.trim_start();
    let tail = v.strip_prefix("[]").or_else(|| v.strip_prefix("{}"));
    tail.is_some_and(|t| {
        let t = t.trim_start();
        t.is_empty() || t.starts_with('#')
    })
}

/// `key: rest` of a top-level line (the key plain or quoted).
fn yaml_key(line: &str) -> Option<(String, &str)> {
    if let Some(q) = line.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let end = line[1..].find(q)? + 1;
        let rest = line[end + 1..].strip_prefix(':')?;
        return Some((line[1..end].to_string(), rest));
    }
    let at = line
        .char_indices()
        .find(|&(i, c)| {
            c == ':'
                && line[i + 1..]
                    .chars()
                    .next()
                    .map_or(true, |n| n == ' ' || n == '\t')
        })?
        .0;
    Some((line[..at].trim_end().to_string(), &line[at + 1..]))
}

/// A YAML scalar: plain, 'single' or "double" quoted, with its comment cut off. None for a
/// null or for nothing (a block follows). Anything else is refused, not guessed at.
fn yaml_scalar(v: &str) -> Result<Option<String>, String> {
    let v = v.trim_start();
    match v.chars().next() {
        None | Some('#') => Ok(None),
        Some('"') => double_quoted(&v[1..]).map(Some),
        Some('\'') => single_quoted(&v[1..]).map(Some),
        Some('|' | '>') => Err("a block scalar, which devgate does not read".into()),
        Some('{' | '[' | '&' | '*' | '!' | '@' | '`') => Err("not a plain string".into()),
        Some(_) => {
            let end = v
                .char_indices()
                .find(|&(i, c)| c == '#' && v[..i].ends_with([' ', '\t']))
                .map_or(v.len(), |(i, _)| i);
            let plain = v[..end].trim_end();
            Ok((!matches!(plain, "~" | "null" | "Null" | "NULL")).then(|| plain.to_string()))
        }
    }
}

/// The end of a quoted scalar: nothing but blanks or a comment may follow it.
fn after_quote(rest: &str) -> Result<(), String> {
    let r = rest.trim_start();
    if r.is_empty() || r.starts_with('#') {
        Ok(())
    } else {
        Err("text after a quoted string".into())
    }
}

fn single_quoted(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if c != '\'' {
            out.push(c);
        } else if it.peek().is_some_and(|&(_, n)| n == '\'') {
            out.push('\'');
            it.next();
        } else {
            after_quote(&s[i + 1..])?;
            return Ok(out);
        }
    }
    Err("a quoted string that does not end on its line".into())
}

fn double_quoted(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '"' => {
                after_quote(&s[i + 1..])?;
                return Ok(out);
            }
            '\\' => {
                let (_, e) = it
                    .next()
                    .ok_or("a quoted string that does not end on its line")?;
                out.push(match e {
                    '\\' | '"' | '/' => e,
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    'e' => '\x1b',
                    _ => return Err(format!("escape \\{e} is not one devgate reads")),
                });
            }
            c => out.push(c),
        }
    }
    Err("a quoted string that does not end on its line".into())
}

// ---------------------------------------------------------------------------------------
// The running kubelet.

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubelet")
            .join(name);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn kubeadm_and_json_configs() {
        assert_eq!(parse_config(&fixture("kubeadm-defaulted.yaml")), Ok(None));
        assert_eq!(
            parse_config(&fixture("kubeadm-podlogsdir.yaml")),
            Ok(Some("/data/log/pods".into()))
        );
        assert_eq!(
            parse_config(&fixture("kubelet-config.json")),
            Ok(Some("/srv/pod-logs".into()))
        );
    }

    #[test]
    fn yaml_scalars_as_yaml_reads_them() {
        for (text, want) in [
            ("podLogsDir: /a # note\n", Some("/a")),
            ("podLogsDir: \"/a b\"  # note\n", Some("/a b")),
            ("podLogsDir: '/it''s'\n", Some("/it's")),
            ("\"podLogsDir\": /q\n", Some("/q")),
            ("podLogsDir: /a#b\n", Some("/a#b")),
            ("---\npodLogsDir: ~\n", Some("")),
            ("podLogsDir:\n", Some("")),
            ("nested:\n  podLogsDir: /not-top\n", None),
            // Generated configs write empty lists and maps in flow style.
            (
                "enforceNodeAllocatable: []\npodLogsDir: /flow # x\n",
                Some("/flow"),
            ),
            (
                "evictionHard: {}  # none\npodLogsDir: /flow\n",
                Some("/flow"),
            ),
            (
                "\u{feff}kind: KubeletConfiguration\npodLogsDir: /bom\n",
                Some("/bom"),
            ),
        ] {
            assert_eq!(parse_config(text), Ok(want.map(String::from)), "{text:?}");
        }
    }

    /// Text a hostile or broken file holds is refused with what is wrong, never guessed at.
    #[test]
    fn odd_configs_are_refused() {
        for (text, err) in [
            (
                "podLogsDir: /a\npodLogsDir: /b\n",
                "podLogsDir is set twice",
            ),
            (
                "kind: KubeProxyConfiguration\n",
                "kind \"KubeProxyConfiguration\" is not KubeletConfiguration",
            ),
            (
                "podLogsDir: |\n  /a\n",
                "podLogsDir: a block scalar, which devgate does not read",
            ),
            ("podLogsDir: [/a]\n", "podLogsDir: not a plain string"),
            ("podLogsDir: []\n", "podLogsDir: not a plain string"),
            (
                "evictionHard: [\npodLogsDir: /x\n]\n",
                "evictionHard: not a plain string",
            ),
            (
                "podLogsDir: \"/a\n",
                "podLogsDir: a quoted string that does not end on its line",
            ),
            (
                "podLogsDir: \"/a\" x\n",
                "podLogsDir: text after a quoted string",
            ),
            (
                "podLogsDir: \"\\q\"\n",
                "podLogsDir: escape \\q is not one devgate reads",
            ),
            (
                "kind: KubeletConfiguration\n---\nkind: X\n",
                "holds more than one YAML document",
            ),
            ("just words\n", "line 1: not `key: value`"),
            ("{\"podLogsDir\": 7}", "podLogsDir is not a string"),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        assert!(parse_config("{")
            .unwrap_err()
            .starts_with("not a JSON object"));
        // Control characters survive the parse: the doctor line escapes them when printed.
        assert_eq!(
            parse_config("podLogsDir: \"/a\\e[31m\"\n"),
            Ok(Some("/a\x1b[31m".into()))
        );
    }

    /// YAML lets a value sit on the lines below its key, a plain scalar go on over
    /// indented lines, and a whole document be indented: each reads a podLogsDir devgate
    /// would not see (and pass kubelet's default, or a cut-off directory), so each is
    /// refused where it concerns the keys devgate reads.
    #[test]
    fn a_value_below_its_key_or_an_indented_document_is_refused() {
        let below = "podLogsDir: a value on the lines below, which devgate does not read";
        for (text, err) in [
            ("podLogsDir:\n  /data/logs\n", below),
            ("podLogsDir:\n\n  # the logs\n  \"/data/logs\"\n", below),
            ("podLogsDir: /data\n  logs\n", below),
            ("podLogsDir:\n- /a\n", below),
            (
                "  kind: KubeletConfiguration\n  podLogsDir: /data/logs\n",
                "line 1: an indented top-level mapping, which devgate does not read",
            ),
            (
                "---\n  podLogsDir: /data/logs\n",
                "line 2: an indented top-level mapping, which devgate does not read",
            ),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        // Other keys' blocks, comments and blank lines stay as they were read.
        for (text, want) in [
            (
                "clusterDNS:\n- 10.96.0.10\npodLogsDir: /x\n  # note\n\nauthentication:\n  x: 1\n",
                Some("/x"),
            ),
            ("# head\n  # indented comment\npodLogsDir: /y\n", Some("/y")),
        ] {
            assert_eq!(parse_config(text), Ok(want.map(String::from)), "{text:?}");
        }
    }

    /// kubelet's YAML (go-yaml, YAML 1.1) breaks lines at a lone CR, NEL, LS and PS too, and
    /// reads a key behind an anchor or a tag, or with an escape in its double quotes, as
    /// the key: each of these read `podLogsDir` for kubelet (sigs.k8s.io/yaml's
    /// YAMLToJSON, checked) that a line-by-line reader of plain keys would not see.
    #[test]
    fn keys_go_yaml_reads_are_not_missed() {
        for (text, err) in [
            (
                "foo: bar\rpodLogsDir: /cr\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "foo: bar\u{2028}podLogsDir: /ls\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "foo: bar\u{85}podLogsDir: /nel\n",
                "a line break devgate does not read (a lone CR, NEL, LS or PS)",
            ),
            (
                "\"podLogs\\x44ir\": /esc\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
            (
                "&a podLogsDir: /anchor\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
            (
                "!!str podLogsDir: /tag\n",
                "line 1: a key devgate does not read (an escape, anchor, tag or alias)",
            ),
        ] {
            assert_eq!(parse_config(text), Err(err.to_string()), "{text:?}");
        }
        // An escape in a quoted key's value is the value's.
        assert_eq!(
            parse_config("\"podLogsDir\": \"/a\\tb\"\n"),
            Ok(Some("/a\tb".into()))
        );
        // A document that is one flow mapping (JSON behind a comment): YAML reads its keys.
        for text in [
            "# kubelet\n{\"apiVersion\": \"v1\", \"podLogsDir\": \"/flow\"}\n",
            "# kubelet\n{a: 1,\n podLogsDir: /flow2}\n",
        ] {
            assert_eq!(
                parse_config(text),
                Err("line 2: a flow collection, which devgate does not read".into()),
                "{text:?}"
            );
        }
        // CRLF is a line break devgate reads.
        assert_eq!(
            parse_config("kind: KubeletConfiguration\r\npodLogsDir: /crlf\r\n"),
            Ok(Some("/crlf".into()))
        );
    }
}
