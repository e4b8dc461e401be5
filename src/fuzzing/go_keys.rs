//! A reference model of how Go's encoding/json (runc's, the NVIDIA toolkit's) and crun's
//! yajl (C strings: a key or a path is its text up to a NUL, `strcmp`) meet the keys of a
//! config.json on the paths devgate reads, written apart from `oci::gokeys`: the
//! fuzz target checks that whatever devgate accepts, this model finds nothing Go would read
//! otherwise, and that whatever devgate refuses for a key, the model finds a cause for.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A JSON value with every key kept, in order: the document before Go folds and merges it.
pub(super) enum Doc {
    Obj(Vec<(String, Doc)>),
    Arr(Vec<Doc>),
    Scalar,
    /// A string holding a NUL.
    NulStr,
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Doc, D::Error> {
        d.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Doc, E> {
        Ok(Doc::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Doc, E> {
        Ok(Doc::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Doc, E> {
        Ok(Doc::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Doc, E> {
        Ok(Doc::Scalar)
    }
    fn visit_str<E>(self, s: &str) -> Result<Doc, E> {
        Ok(if s.contains('\0') {
            Doc::NulStr
        } else {
            Doc::Scalar
        })
    }
    fn visit_unit<E>(self) -> Result<Doc, E> {
        Ok(Doc::Scalar)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Doc, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = s.next_element()? {
            out.push(v);
        }
        Ok(Doc::Arr(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Doc, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = m.next_entry::<String, Doc>()? {
            out.push((k, v));
        }
        Ok(Doc::Obj(out))
    }
}

/// What devgate reads under a key.
enum Shape {
    Leaf,
    /// A path, which crun reads as a C string.
    Path,
    /// An object with these fields.
    Obj(&'static [(&'static str, Shape)]),
    /// An array of such objects.
    Each(&'static [(&'static str, Shape)]),
    /// A map whose keys are data (Go's map: exact keys, the last of a repeated one wins).
    Map,
}

use Shape::{Each, Leaf, Map, Obj, Path};

const RULE: &[(&str, Shape)] = &[
    ("allow", Leaf),
    ("type", Leaf),
    ("major", Leaf),
    ("minor", Leaf),
    ("access", Leaf),
];
const DEVICE: &[(&str, Shape)] = &[
    ("path", Path),
    ("type", Leaf),
    ("major", Leaf),
    ("minor", Leaf),
    ("fileMode", Leaf),
    ("uid", Leaf),
    ("gid", Leaf),
];
const CAPS: &[(&str, Shape)] = &[
    ("bounding", Leaf),
    ("effective", Leaf),
    ("inheritable", Leaf),
    ("permitted", Leaf),
    ("ambient", Leaf),
];
const MOUNT: &[(&str, Shape)] = &[
    ("destination", Path),
    ("type", Leaf),
    ("source", Path),
    ("options", Leaf),
];
const LINUX: &[(&str, Shape)] = &[
    ("devices", Each(DEVICE)),
    ("resources", Obj(&[("devices", Each(RULE))])),
    ("cgroupsPath", Leaf),
    ("namespaces", Each(&[("type", Leaf)])),
];
/// The paths of config.json that devgate reads.
const SPEC: &[(&str, Shape)] = &[
    ("ociVersion", Leaf),
    (
        "process",
        Obj(&[("env", Leaf), ("capabilities", Obj(CAPS))]),
    ),
    ("root", Obj(&[("path", Leaf)])),
    ("mounts", Each(MOUNT)),
    ("annotations", Map),
    ("linux", Obj(LINUX)),
];

/// Go's fold of one key (strings.EqualFold): ASCII case, and the two runes whose
/// SimpleFold orbit holds an ASCII letter (U+017F with s, U+212A with k).
fn go_fold(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{17f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Whether Go or crun would read `doc`, on the paths devgate reads, otherwise than an
/// exact, duplicate-free reader does.
pub(super) fn read_apart(doc: &Doc) -> bool {
    apart(doc, &Obj(SPEC))
}

fn apart(doc: &Doc, shape: &Shape) -> bool {
    match (shape, doc) {
        (Obj(fields), Doc::Obj(entries)) => object_apart(entries, fields),
        (Each(fields), Doc::Arr(items)) => items.iter().any(|d| apart(d, &Obj(fields))),
        (Path, Doc::NulStr) => true,
        (Map, Doc::Obj(entries)) => entries
            .iter()
            .enumerate()
            .any(|(i, (k, _))| entries[..i].iter().any(|(k2, _)| k2 == k)),
        _ => false,
    }
}

fn object_apart(entries: &[(String, Doc)], fields: &[(&str, Shape)]) -> bool {
    entries.iter().enumerate().any(
        |(i, (k, v))| match fields.iter().find(|(name, _)| name == k) {
            Some((_, shape)) => entries[..i].iter().any(|(k2, _)| k2 == k) || apart(v, shape),
            None => {
                let c_string = k.split('\0').next().unwrap_or(k);
                fields.iter().any(|(name, _)| {
                    go_fold(name) == go_fold(k)
                        || (k.contains('\0') && go_fold(name) == go_fold(c_string))
                })
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apart_json(s: &str) -> bool {
        read_apart(&serde_json::from_str(s).unwrap())
    }

    #[test]
    fn the_model_sees_what_go_reads_otherwise() {
        assert!(apart_json(
            r#"{"process":{"capabilities":{"Bounding":[]}}}"#
        ));
        assert!(apart_json(r#"{"linux":{},"linux":{}}"#));
        assert!(apart_json(r#"{"annotations":{"a":"1","a":"2"}}"#));
        assert!(apart_json("{\"mount\u{17f}\":[]}"));
        assert!(!apart_json(
            "{\"l\u{131}nux\":{},\"hostname\":1,\"hostname\":2}"
        ));
        assert!(!apart_json(
            r#"{"annotations":{"a":"1","A":"2"},"process":{"args":[],"Args":[]}}"#
        ));
        // crun's C strings: a key or a path up to its NUL
        assert!(apart_json(r#"{"linux":{"devices\u0000":[]}}"#));
        assert!(apart_json(r#"{"mounts":[{"source":"/dev/x\u0000"}]}"#));
        assert!(!apart_json(r#"{"process":{"args\u0000":[]}}"#));
    }
}
