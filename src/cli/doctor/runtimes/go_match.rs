//! Go's `path.Match`, which containerd's CRI uses to pick the annotations it copies into a
//! container's spec (`container_annotations`, `pod_annotations`: each entry a pattern).
//! doctor answers "does this runtime pass kubelet's annotation?" as containerd would.

/// One element of a pattern.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    Char(char),
    /// `?`: one character but `/`.
    Any,
    /// `*`: any run of characters but `/`.
    Star,
    /// `[...]`, `[^...]`: ranges, inclusive.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// The pattern's tokens, or None where Go's `path.Match` answers ErrBadPattern (then
/// containerd passes nothing for it).
fn tokens(pattern: &str) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut it = pattern.chars().peekable();
    while let Some(c) = it.next() {
        out.push(match c {
            '*' => Token::Star,
            '?' => Token::Any,
            '\\' => Token::Char(it.next()?),
            '[' => {
                let negated = it.next_if_eq(&'^').is_some();
                let mut ranges = Vec::new();
                loop {
                    match it.peek() {
                        Some(']') if !ranges.is_empty() => {
                            it.next();
                            break;
                        }
                        None | Some('-' | ']') => return None,
                        _ => {}
                    }
                    let lo = class_char(&mut it)?;
                    let hi = if it.next_if_eq(&'-').is_some() {
                        class_char(&mut it)?
                    } else {
                        lo
                    };
                    ranges.push((lo, hi));
                }
                Token::Class { negated, ranges }
            }
            c => Token::Char(c),
        });
    }
    Some(out)
}

/// A character of a class: itself, or the one after `\`; `-`, `]` or the end are bad.
fn class_char(it: &mut std::iter::Peekable<std::str::Chars>) -> Option<char> {
    match it.next()? {
        '-' | ']' => None,
        '\\' => it.next(),
        c => Some(c),
    }
}

fn matches_one(t: &Token, c: char) -> bool {
    match t {
        Token::Char(x) => *x == c,
        Token::Any => c != '/',
        Token::Star => unreachable!("a star is matched by the table"),
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Whether `name` matches `pattern` as Go's `path.Match` says (a bad pattern matches
/// nothing). A table over (token, position), so no pattern costs more than their product.
pub(crate) fn go_path_match(pattern: &str, name: &str) -> bool {
    let Some(toks) = tokens(pattern) else {
        return false;
    };
    let chars: Vec<char> = name.chars().collect();
    // row[j]: the tokens so far match chars[..j].
    let mut row = vec![false; chars.len() + 1];
    row[0] = true;
    for t in &toks {
        let mut next = vec![false; chars.len() + 1];
        if *t == Token::Star {
            next[0] = row[0];
            for j in 1..=chars.len() {
                next[j] = row[j] || (next[j - 1] && chars[j - 1] != '/');
            }
        } else {
            for j in 1..=chars.len() {
                next[j] = row[j - 1] && matches_one(t, chars[j - 1]);
            }
        }
        row = next;
    }
    row[chars.len()]
}

#[cfg(test)]
mod tests {
    use super::go_path_match as m;

    const KEY: &str = "io.kubernetes.container.terminationMessagePolicy";

    /// Cases from Go's own path.Match tests (src/path/match_test.go) and the patterns
    /// operators write in container_annotations.
    #[test]
    fn as_go_matches() {
        for (p, n, want) in [
            ("abc", "abc", true),
            ("*", "abc", true),
            ("*c", "abc", true),
            ("a*", "a", true),
            ("a*", "abc", true),
            ("a*", "ab/c", false),
            ("a*/b", "abc/b", true),
            ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
            ("a*b*c*d*e*/f", "axbxcxdxexxx/fff", false),
            ("ab[c]", "abc", true),
            ("ab[b-d]", "abc", true),
            ("ab[e-g]", "abc", false),
            ("ab[^c]", "abc", false),
            ("ab[^e-g]", "abc", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "ab", false),
            ("a?b", "a☺b", true),
            ("a?b", "a/b", false),
            ("[\\-]", "-", true),
            ("[x\\-]", "z", false),
            ("*x", "xxx", true),
            // Bad patterns match nothing.
            ("[", "a", false),
            ("[^", "a", false),
            ("[]a]", "]", false),
            ("[-]", "-", false),
            ("[x-]", "x", false),
            ("a\\", "a", false),
            ("[a-b-c]", "a", false),
        ] {
            assert_eq!(m(p, n), want, "{p:?} {n:?}");
        }
    }

    #[test]
    fn kubelets_annotation() {
        assert!(m(KEY, KEY));
        assert!(m("io.kubernetes.container.*", KEY));
        assert!(m("*", KEY));
        assert!(m("io.kubernetes.*", KEY));
        assert!(!m("io.kubernetes.container.terminationMessagePath", KEY));
        assert!(!m("io.kubernetes.cri.*", KEY));
        assert!(!m("", KEY));
        // A pattern of thousands of stars stays a table, not an exponential search.
        assert!(!m(&format!("{}x", "*".repeat(5000)), KEY));
    }
}
