//! The XID table: what each NVIDIA XID number means for a GPU's health. Data, not code:
//! the built-in table is NVIDIA's XID catalog (`xid_catalog.tsv`, compiled in, with its
//! source and date), and the operator's `gpu.xid_actions` overrides it; config validation
//! builds it once so a bad override fails at load.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XidAction {
    /// The GPU needs a reset or the node a reboot: unhealthy until that happens.
    Unhealthy,
    /// Reported, never blocking.
    Warn,
    /// An application's own fault, or nothing to do; the GPU is fine.
    Ignore,
}

/// NVIDIA's immediate action for an XID, as the catalog's resolution bucket says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidResolution {
    /// RESET_GPU.
    Reset,
    /// RESTART_BM, RESTART_VM: the node (or VM) must restart.
    Reboot,
    /// RESTART_APP: the application faulted; the GPU is fine.
    RestartApp,
    /// IGNORE.
    None,
    /// Anything a hook cannot act on by itself: contact support, check mechanicals,
    /// a workflow that needs more than the XID number.
    Investigate,
}

impl XidResolution {
    fn parse(s: &str) -> Option<XidResolution> {
        Some(match s {
            "reset" => XidResolution::Reset,
            "reboot" => XidResolution::Reboot,
            "restart_app" => XidResolution::RestartApp,
            "none" => XidResolution::None,
            "investigate" => XidResolution::Investigate,
            _ => return Option::None,
        })
    }

    /// What the resolution means for the gate.
    pub fn action(self) -> XidAction {
        match self {
            XidResolution::Reset | XidResolution::Reboot => XidAction::Unhealthy,
            XidResolution::RestartApp | XidResolution::None => XidAction::Ignore,
            XidResolution::Investigate => XidAction::Warn,
        }
    }

    /// The words a reject line ends with.
    pub fn advice(self) -> &'static str {
        match self {
            XidResolution::Reset => "GPU reset required",
            XidResolution::Reboot => "node reboot required",
            XidResolution::RestartApp => "restart the application",
            XidResolution::None => "no action needed",
            XidResolution::Investigate => "NVIDIA advises investigation",
        }
    }
}

/// One catalog row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    pub xid: u32,
    /// NVIDIA's bucket, verbatim (`RESET_GPU`, `WORKFLOW_XID_48`, `-`).
    pub bucket: &'static str,
    pub resolution: XidResolution,
    pub description: &'static str,
}

const CATALOG_TSV: &str = include_str!("xid_catalog.tsv");

/// What is wrong with the XID table: a row of the built-in catalog, or one of the
/// operator's `gpu.xid_actions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XidError {
    /// Catalog line `line` (counted from 1) does not parse.
    Catalog { line: usize, row: BadRow },
    /// A `gpu.xid_actions` key that is not an XID number.
    NotXid { key: String },
    /// A `gpu.xid_actions` value that is not an action.
    NotAction { key: String, value: String },
}

/// How a catalog row is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRow {
    /// Not 4 tab-separated fields.
    Fields,
    /// The first field, not a number.
    Xid(&'static str),
    /// The third field, not a resolution devgate knows.
    Resolution(&'static str),
}

impl fmt::Display for XidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XidError::Catalog { line, row } => {
                write!(f, "xid catalog line {line}: ")?;
                match row {
                    BadRow::Fields => write!(f, "not 4 tab-separated fields"),
                    BadRow::Xid(x) => write!(f, "{x:?} is not a number"),
                    BadRow::Resolution(r) => write!(f, "bad resolution {r:?}"),
                }
            }
            XidError::NotXid { key } => write!(f, "gpu.xid_actions: {key:?} is not an XID number"),
            XidError::NotAction { key, value } => write!(
                f,
                "gpu.xid_actions.{key}: {value:?} is not one of unhealthy, warn, ignore"
            ),
        }
    }
}

impl std::error::Error for XidError {}

/// One data row of the catalog; `None` for a comment or blank line.
fn parse_row(line: &'static str, number: usize) -> Option<Result<CatalogEntry, XidError>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let bad = |row: BadRow| Some(Err(XidError::Catalog { line: number, row }));
    let mut f = line.splitn(4, '\t');
    let (Some(xid), Some(bucket), Some(resolution), Some(description)) =
        (f.next(), f.next(), f.next(), f.next())
    else {
        return bad(BadRow::Fields);
    };
    if description.contains('\t') {
        return bad(BadRow::Fields);
    }
    let Ok(xid) = xid.parse() else {
        return bad(BadRow::Xid(xid));
    };
    let Some(resolution) = XidResolution::parse(resolution) else {
        return bad(BadRow::Resolution(resolution));
    };
    Some(Ok(CatalogEntry {
        xid,
        bucket,
        resolution,
        description,
    }))
}

/// Parses the whole catalog text. Every row must parse: a unit test holds the checked-in
/// file to that, so [`catalog_entry`] may skip the rows it is not asked about.
#[cfg(test)]
fn parse_catalog(text: &'static str) -> Result<Vec<CatalogEntry>, XidError> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| parse_row(line, i + 1))
        .collect()
}

/// The catalog's row for `xid`. A start asks about one or two XIDs, so only the row whose
/// first field is that number is parsed: building the whole table (with its long
/// descriptions) cost more than the rest of the XID probe.
pub fn catalog_entry(xid: u32) -> Option<CatalogEntry> {
    // Start-up trick (docs/performance.md). Plain: parse the whole catalog.
    let key = xid.to_string();
    CATALOG_TSV.lines().enumerate().find_map(|(i, line)| {
        let rest = line.strip_prefix(key.as_str())?;
        if !rest.starts_with('\t') {
            return None;
        }
        parse_row(line, i + 1)?.ok()
    })
}

/// The catalog with the operator's `gpu.xid_actions` over it.
#[derive(Debug, Clone, Default)]
pub struct XidTable {
    overrides: BTreeMap<u32, XidAction>,
}

impl XidTable {
    /// Keys are XID numbers as strings, values `unhealthy`, `warn` or `ignore`.
    pub fn new(overrides: &BTreeMap<String, String>) -> Result<XidTable, XidError> {
        let mut t = XidTable::default();
        for (k, v) in overrides {
            let xid: u32 = k
                .trim()
                .parse()
                .map_err(|_| XidError::NotXid { key: k.clone() })?;
            let action = match v.as_str() {
                "unhealthy" => XidAction::Unhealthy,
                "warn" => XidAction::Warn,
                "ignore" => XidAction::Ignore,
                other => {
                    return Err(XidError::NotAction {
                        key: k.clone(),
                        value: other.to_string(),
                    })
                }
            };
            t.overrides.insert(xid, action);
        }
        Ok(t)
    }

    /// The operator's word, else the catalog's, else a warning: new drivers add XIDs, and
    /// an unknown one should be seen, not ignored and not blocking.
    pub fn action(&self, xid: u32) -> XidAction {
        if let Some(a) = self.overrides.get(&xid) {
            return *a;
        }
        catalog_entry(xid).map_or(XidAction::Warn, |e| e.resolution.action())
    }

    pub fn is_overridden(&self, xid: u32) -> bool {
        self.overrides.contains_key(&xid)
    }
}

pub fn describe_xid(xid: u32) -> Option<&'static str> {
    catalog_entry(xid).map(|e| e.description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_overrides_are_errors() {
        let mut o = BTreeMap::new();
        o.insert("x79".to_string(), "warn".to_string());
        let e = XidTable::new(&o).unwrap_err();
        assert_eq!(e, XidError::NotXid { key: "x79".into() });
        assert_eq!(
            e.to_string(),
            "gpu.xid_actions: \"x79\" is not an XID number"
        );
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "explode".to_string());
        let e = XidTable::new(&o).unwrap_err();
        assert!(matches!(e, XidError::NotAction { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "gpu.xid_actions.79: \"explode\" is not one of unhealthy, warn, ignore"
        );
        let row = parse_row("x\tRESET_GPU\treset\td", 7).unwrap().unwrap_err();
        assert_eq!(row.to_string(), "xid catalog line 7: \"x\" is not a number");
        let row = parse_row("1\tRESET_GPU\tboom\td", 8).unwrap().unwrap_err();
        assert_eq!(
            row.to_string(),
            "xid catalog line 8: bad resolution \"boom\""
        );
        let row = parse_row("1\tRESET_GPU", 9).unwrap().unwrap_err();
        assert_eq!(
            row.to_string(),
            "xid catalog line 9: not 4 tab-separated fields"
        );
    }

    #[test]
    fn the_checked_in_catalog_parses_whole_and_follows_nvidia() {
        let rows = parse_catalog(CATALOG_TSV).unwrap();
        for r in &rows {
            assert_eq!(catalog_entry(r.xid), Some(*r), "xid {}", r.xid);
        }
        assert!(rows.len() > 100, "{}", rows.len());
        let mut seen = std::collections::BTreeSet::new();
        for r in &rows {
            assert!(seen.insert(r.xid), "xid {} twice", r.xid);
            // The bucket and devgate's reading of it agree wherever the bucket is plain.
            let plain = match r.bucket {
                "RESET_GPU" => Some(XidResolution::Reset),
                "RESTART_BM" | "RESTART_VM" => Some(XidResolution::Reboot),
                "RESTART_APP" => Some(XidResolution::RestartApp),
                "IGNORE" => Some(XidResolution::None),
                "CONTACT_SUPPORT" | "-" => Some(XidResolution::Investigate),
                _ => Option::None,
            };
            if let Some(p) = plain {
                assert_eq!(r.resolution, p, "xid {}", r.xid);
            }
        }
        let t = XidTable::default();
        assert_eq!(t.action(79), XidAction::Unhealthy); // RESTART_BM
        assert_eq!(t.action(95), XidAction::Unhealthy); // RESET_GPU
        assert_eq!(t.action(48), XidAction::Unhealthy); // WORKFLOW_XID_48
        assert_eq!(t.action(13), XidAction::Ignore); // RESTART_APP
        assert_eq!(t.action(63), XidAction::Ignore); // IGNORE
        assert_eq!(t.action(154), XidAction::Warn); // the line decides
        assert_eq!(t.action(9999), XidAction::Warn); // unknown: warns, never ignored
        assert_eq!(catalog_entry(79).unwrap().bucket, "RESTART_BM");
    }

    #[test]
    fn a_malformed_catalog_row_is_an_error_naming_its_line() {
        assert_eq!(
            parse_catalog("# c\n79\tRESTART_BM\treboot\n").unwrap_err(),
            XidError::Catalog {
                line: 2,
                row: BadRow::Fields
            }
        );
        assert_eq!(
            parse_catalog("79\tRESTART_BM\texplode\td\n").unwrap_err(),
            XidError::Catalog {
                line: 1,
                row: BadRow::Resolution("explode")
            }
        );
    }
}
