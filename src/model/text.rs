//! Text that came from outside (a container id, a quarantine reason, a driver's log line)
//! passes through here before it reaches a terminal, a log or a termination message.

/// Flattens control characters (newlines, escapes) to spaces: a line stays one line and
/// cannot move an operator's cursor.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
