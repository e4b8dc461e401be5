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

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z`, as the API server writes a time, in unix seconds; None
/// for anything else. The inverse of [`rfc3339`] (fractions cut).
pub fn unix_of_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || *b.last()? != b'Z' {
        return None;
    }
    let frac = &s[19..s.len() - 1];
    if !(frac.is_empty() || frac.starts_with('.') && frac[1..].bytes().all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if y < 1970 || !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), March-based years.
    let (y, mo) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146097 + doe).checked_sub(719468)?;
    Some(days * 86400 + h * 3600 + mi * 60 + se)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unix_of_rfc3339_reads_what_rfc3339_writes_and_nothing_else() {
        use super::unix_of_rfc3339;
        for bad in [
            "2026-12-05 00:00:00Z",
            "2026-13-05T00:00:00Z",
            "x",
            "2026-12-05T00:00:00+01:00",
        ] {
            assert_eq!(unix_of_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(unix_of_rfc3339("1970-01-01T00:00:01.5Z"), Some(1));
        assert_eq!(unix_of_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
        for secs in [0, 951_782_400, 1_796_223_098] {
            assert_eq!(unix_of_rfc3339(&super::rfc3339(secs)), Some(secs));
        }
    }

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_223_098), "2026-12-02T14:51:38Z");
    }
}
