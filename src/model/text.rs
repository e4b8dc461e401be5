//! Text that came from outside (a container id, a spec path, a quarantine reason, a
//! driver's log line, an NVML string, a config value) passes through here before it
//! reaches a terminal, a log, the reject line, a record's message, a metrics label or a
//! termination message. This is devgate's one escaping function.

/// Escapes what could move an operator's cursor, forge a line or reorder what they read:
/// C0 and C1 control characters and DEL become `\xNN`; the line and paragraph separators
/// (U+2028, U+2029), the bidirectional embeddings, overrides and isolates
/// (U+202A–U+202E, U+2066–U+2069) and the invisible direction marks (U+200E, U+200F,
/// U+061C; the set rustc's own lint warns of) become `\u{...}`. Everything else is kept as
/// it is, so ordinary text and paths read the same.
pub fn one_line(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let n = c as u32;
        if n < 0x20 || (0x7f..=0x9f).contains(&n) {
            let _ = write!(out, "\\x{n:02x}");
        } else if separates_or_reorders(n) {
            let _ = write!(out, "\\u{{{n:04x}}}");
        } else {
            out.push(c);
        }
    }
    out
}

/// The characters [`one_line`] escapes beyond C0 (which JSON escapes itself).
fn needs_json_escape(c: char) -> bool {
    let n = c as u32;
    (0x7f..=0x9f).contains(&n) || separates_or_reorders(n)
}

/// Line and paragraph separators, and the characters that change the order or direction
/// text is shown in.
fn separates_or_reorders(n: u32) -> bool {
    matches!(
        n,
        0x2028 | 0x2029 | 0x202a..=0x202e | 0x2066..=0x2069 | 0x200e | 0x200f | 0x061c
    )
}

/// Serialized JSON made safe to show: serde_json escapes C0 controls, quotes and
/// backslashes, but leaves DEL, C1 controls, the line separators and the bidi controls
/// raw, and `cat` of a record or `--json` output would pass them to the terminal. Those
/// can only occur inside JSON strings, so each becomes a `\uXXXX` escape there: the JSON
/// means exactly the same, and every reader gets the same value back.
pub fn json_safe(json: Vec<u8>) -> Vec<u8> {
    // Nearly every record is plain ASCII without DEL: two word-at-a-time scans, no copy.
    if json.is_ascii() && !json.contains(&0x7f) {
        return json;
    }
    let Ok(text) = std::str::from_utf8(&json) else {
        return json;
    };
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_json_escape(c) {
            use std::fmt::Write;
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out.into_bytes()
}

/// [`json_safe`] for a String.
pub fn json_safe_string(json: String) -> String {
    String::from_utf8(json_safe(json.into_bytes())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{json_safe, one_line};

    #[test]
    fn json_keeps_its_value_and_loses_raw_controls() {
        let value = "a\u{7f}\u{85}\u{202e}b\u{2028}\x1b日本";
        let raw = serde_json::to_vec(&serde_json::json!({ "message": value })).unwrap();
        let safe = json_safe(raw);
        let text = String::from_utf8(safe.clone()).unwrap();
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() || super::needs_json_escape(c)),
            "{text:?}"
        );
        assert!(text.contains("\\u202e") && text.contains("日本"), "{text}");
        let back: serde_json::Value = serde_json::from_slice(&safe).unwrap();
        assert_eq!(back["message"], value);
        let ascii = br#"{"a":"b"}"#.to_vec();
        assert_eq!(json_safe(ascii.clone()), ascii);
    }

    #[test]
    fn escapes_controls_separators_and_bidi_only() {
        assert_eq!(
            one_line("a\x1b[2J\r\n\0\x7f\u{85}\u{9f}b"),
            "a\\x1b[2J\\x0d\\x0a\\x00\\x7f\\x85\\x9fb"
        );
        assert_eq!(
            one_line("x\u{2028}\u{2029}\u{202a}\u{202e}\u{2066}\u{2069}y"),
            "x\\u{2028}\\u{2029}\\u{202a}\\u{202e}\\u{2066}\\u{2069}y"
        );
        // the invisible direction marks, which reorder what sits beside right-to-left text
        assert_eq!(
            one_line("a\u{200e}\u{200f}\u{61c}b"),
            "a\\u{200e}\\u{200f}\\u{061c}b"
        );
        assert_eq!(
            String::from_utf8(json_safe("\"a\u{200f}\"".as_bytes().to_vec())).unwrap(),
            "\"a\\u200f\""
        );
        assert_eq!(
            one_line("/dev/nvidia0 GPU-ü 日本"),
            "/dev/nvidia0 GPU-ü 日本"
        );
        assert_eq!(
            one_line("\u{202f}\u{2065}\u{206a}"),
            "\u{202f}\u{2065}\u{206a}"
        );
    }
}
