//! The clock: seconds since the epoch for machines, RFC 3339 UTC for people.

/// Seconds since the epoch, and the same instant as RFC 3339 UTC for people.
pub fn now() -> (u64, String) {
    let secs = now_unix();
    (secs, rfc3339(secs))
}

/// Seconds since the epoch (0 before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Now as RFC 3339 UTC with nanoseconds (Go's RFC3339Nano, as CRI log records carry it).
pub fn now_rfc3339_nano() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = rfc3339(d.as_secs());
    format!("{}.{:09}Z", secs.trim_end_matches('Z'), d.subsec_nanos())
}

/// Howard Hinnant's civil-from-days, so devgate needs no date crate for one format.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_223_098), "2026-12-02T14:51:38Z");
    }
}
