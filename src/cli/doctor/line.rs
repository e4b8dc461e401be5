//! One line of doctor's report: its mark (passed, failed, a note), the check, what was found,
//! and for a failure the fix; and its printed form, escaped.

use crate::model::text::one_line;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    Pass,
    Fail,
    Note,
    /// Worth a look, fails nothing (counted with the notes).
    Warn,
}

impl Mark {
    fn symbol(self) -> &'static str {
        match self {
            Mark::Pass => "✓",
            Mark::Fail => "✗",
            Mark::Note => "-",
            Mark::Warn => "⚠",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) mark: Mark,
    pub(crate) check: String,
    pub(crate) text: String,
    pub(crate) fix: Option<String>,
}

impl Line {
    pub(crate) fn pass(check: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            mark: Mark::Pass,
            check: check.into(),
            text: text.into(),
            fix: None,
        }
    }

    pub(crate) fn fail(
        check: impl Into<String>,
        text: impl Into<String>,
        fix: impl Into<String>,
    ) -> Line {
        Line {
            mark: Mark::Fail,
            check: check.into(),
            text: text.into(),
            fix: Some(fix.into()),
        }
    }

    pub(crate) fn note(check: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            mark: Mark::Note,
            check: check.into(),
            text: text.into(),
            fix: None,
        }
    }

    pub(crate) fn warn(check: impl Into<String>, text: impl Into<String>) -> Line {
        Line {
            mark: Mark::Warn,
            check: check.into(),
            text: text.into(),
            fix: None,
        }
    }

    /// The printed form: the mark line, and for a failure its fix on the next line.
    pub(crate) fn render(&self) -> String {
        let mut s = one_line(&format!(
            "{} {}: {}",
            self.mark.symbol(),
            self.check,
            self.text
        ));
        if let Some(f) = &self.fix {
            s.push_str("\n  fix: ");
            s.push_str(&one_line(f));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_control_characters() {
        assert_eq!(one_line("a\x1b[31mb\nc\u{9b}"), "a\\x1b[31mb\\x0ac\\x9b");
        assert_eq!(one_line("GPU ✓ é"), "GPU ✓ é");
        let l = Line::fail("x", "bad\nline", "do\x07this");
        assert_eq!(l.render(), "✗ x: bad\\x0aline\n  fix: do\\x07this");
    }
}
