//! Text that came from outside (a container id, a spec path, a quarantine reason, a
//! driver's log line, an NVML string, a config value) passes through here before it
//! reaches a terminal, a log, the reject line, a record's message, a metrics label or a
//! termination message. This is devgate's one escaping function.

/// Escapes what could move an operator's cursor, forge a line or reorder what they read:
/// C0 and C1 control characters and DEL become `\xNN`; the line and paragraph separators
/// (U+2028, U+2029) and the bidirectional embeddings, overrides and isolates
/// (U+202A–U+202E, U+2066–U+2069) become `\u{...}`. Everything else is kept as it is, so
/// ordinary text and paths read the same.
pub fn one_line(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let n = c as u32;
        if n < 0x20 || (0x7f..=0x9f).contains(&n) {
            let _ = write!(out, "\\x{n:02x}");
        } else if matches!(n, 0x2028 | 0x2029 | 0x202a..=0x202e | 0x2066..=0x2069) {
            let _ = write!(out, "\\u{{{n:04x}}}");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

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
