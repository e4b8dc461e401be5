//! Kubernetes' name rules, as the API server checks them, and the names devgate gives its
//! own objects: deterministic, so a restarted agent finds what it made before.

/// A DNS-1123 label: 1-63 of [a-z0-9-], alphanumeric at both ends.
pub fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// A qualified name's name part: 1-63 of [A-Za-z0-9-_.], alphanumeric at both ends.
fn is_qualified_part(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| ok(b) || b == b'-' || b == b'_' || b == b'.')
        && ok(s.as_bytes()[0])
        && ok(s.as_bytes()[s.len() - 1])
}

/// A taint key: a qualified name (`prefix/name` or `name`).
pub fn is_taint_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_subdomain(prefix) && is_qualified_part(name),
        None => is_qualified_part(s),
    }
}

/// A label value: empty, or a qualified name part. Devgate's codes are always one; this
/// keeps a taint value valid whatever a code becomes.
pub fn label_value(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    trimmed.to_string()
}

/// The `generateName` of the DeviceTaintRule devgate keeps for one device:
/// `devgate-<node>-<device>-`, the API server adding 5 characters; `devgate-` where that
/// would not be a valid name. A prefix, never a whole name: anyone may create a rule of a
/// name devgate could predict, and then the agent could not own it (issue #36).
pub fn rule_prefix(node: &str, device: &str) -> String {
    let readable = format!("devgate-{node}-{device}-");
    if is_subdomain(&format!("{readable}xxxxx")) {
        return readable;
    }
    "devgate-".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_prefixes_are_valid_names_once_completed() {
        assert_eq!(rule_prefix("node-1", "gpu-2"), "devgate-node-1-gpu-2-");
        assert_eq!(rule_prefix(&"n".repeat(250), "gpu-0"), "devgate-");
        assert_eq!(rule_prefix("node-1", "GPU_2"), "devgate-");
    }

    #[test]
    fn name_rules() {
        assert!(is_subdomain("node-1.example.com"));
        assert!(!is_subdomain("Node"));
        assert!(!is_subdomain("a..b"));
        assert!(is_taint_key("devgate.io/unhealthy"));
        assert!(is_taint_key("unhealthy"));
        assert!(!is_taint_key("devgate.io/"));
        assert!(!is_taint_key("/x"));
        assert_eq!(label_value("xid"), "xid");
        assert_eq!(label_value("a b/c"), "a_b_c");
        assert_eq!(label_value(&"x".repeat(99)).len(), 63);
        assert_eq!(label_value("-_x_-"), "x");
    }
}
