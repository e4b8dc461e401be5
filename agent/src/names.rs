//! Kubernetes' name rules, as the API server checks them, and the names devgate gives its
//! own objects: deterministic, so a restarted agent finds what it made before.

use sha2::{Digest, Sha256};

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

fn hex(bytes: &[u8], n: usize) -> String {
    bytes
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .take(n)
        .map(|d| char::from_digit(d as u32, 16).unwrap())
        .collect()
}

/// The DeviceTaintRule devgate keeps for one device: `devgate-<node>-<device>-<8 hex>`, the
/// hex from driver/pool/device so two drivers' devices of one name differ; a name that
/// would be over 253 characters or invalid is `devgate-<16 hex>`.
pub fn rule_name(node: &str, driver: &str, pool: &str, device: &str) -> String {
    let digest = Sha256::digest(format!("{driver}/{pool}/{device}").as_bytes());
    let readable = format!("devgate-{node}-{device}-{}", hex(&digest, 8));
    if is_subdomain(&readable) {
        return readable;
    }
    let all = Sha256::digest(format!("{node}/{driver}/{pool}/{device}").as_bytes());
    format!("devgate-{}", hex(&all, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_stable_valid_and_distinct() {
        let a = rule_name("node-1", "gpu.nvidia.com", "node-1", "gpu-2");
        assert!(a.starts_with("devgate-node-1-gpu-2-"), "{a}");
        assert_eq!(a.len(), "devgate-node-1-gpu-2-".len() + 8);
        assert_eq!(a, rule_name("node-1", "gpu.nvidia.com", "node-1", "gpu-2"));
        assert_ne!(
            a,
            rule_name("node-1", "other.example.com", "node-1", "gpu-2")
        );
        let long = "n".repeat(250);
        let b = rule_name(&long, "d", "p", "gpu-0");
        assert!(is_subdomain(&b) && b.len() == 24, "{b}");
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
