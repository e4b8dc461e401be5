//! Keys as Go's `encoding/json` reads them. runc and the NVIDIA toolkit decode config.json
//! with it: a key names a struct field case-insensitively, with Unicode simple folding, and a
//! repeated key merges into the object or (scalars, arrays) the last one wins. serde and crun
//! match exactly. So a config.json with a folded spelling or a repeated key on a path devgate
//! reads is refused: the runtimes do not even agree with one another, and devgate must never
//! check one thing while runc starts another.
//!
//! The check rides on the one parse (a map visitor sees each key once): a second parse into a
//! `serde_json::Value` would cost every container start far more.

use crate::model::text::one_line;
use serde::de::{self, Deserializer, Visitor};
use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

/// What makes a config.json's key read apart by runc and devgate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyFault {
    /// The same key twice in one object; the key's full path.
    Duplicate(String),
    /// A key Go folds to a field devgate reads, not spelled exactly so, or one crun reads
    /// as that field up to a NUL.
    NonCanonical { key: String, at: &'static str },
}

impl fmt::Display for KeyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFault::Duplicate(path) => write!(f, "duplicate key \"{}\"", one_line(path)),
            KeyFault::NonCanonical { key, at } => {
                let at = if at.is_empty() { "(top level)" } else { at };
                write!(f, "non-canonical key \"{}\" at {at}", one_line(key))
            }
        }
    }
}

thread_local! {
    // serde's errors are strings; the typed fault waits here for `Spec::parse`.
    static FAULT: RefCell<Option<KeyFault>> = const { RefCell::new(None) };
}

/// The fault the last failed parse on this thread raised, if a key was its cause.
pub(crate) fn take_fault() -> Option<KeyFault> {
    FAULT.with(|f| f.borrow_mut().take())
}

fn raise<E: de::Error>(fault: KeyFault) -> E {
    let e = E::custom(&fault);
    FAULT.with(|f| *f.borrow_mut() = Some(fault));
    e
}

/// `at.name`, the path a duplicate is reported by.
fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

/// A repeated `name` in the object at `at`.
pub(crate) fn duplicate<E: de::Error>(at: &str, name: &str) -> E {
    raise(KeyFault::Duplicate(join(at, name)))
}

/// Go's `strings.EqualFold(key, name)` for an ASCII `name`. Go's json folds each rune to the
/// smallest of its `unicode.SimpleFold` orbit (encoding/json/fold.go, `foldRune`, read in
/// golang/go); the only non-ASCII runes whose orbit holds an ASCII letter are U+017F (long
/// s: S, s, ſ) and U+212A (Kelvin sign: K, k, K). U+0131 (dotless i) and U+0130 fold alone.
pub(crate) fn go_fold_eq(key: &str, name: &str) -> bool {
    if key.len() == name.len() {
        // same bytes: any non-ASCII rune would leave fewer runes than `name` has
        return key.eq_ignore_ascii_case(name);
    }
    if key.is_ascii() {
        return false;
    }
    let mut runes = key.chars();
    name.bytes()
        .all(|n| runes.next().is_some_and(|c| folds_to(c, n)))
        && runes.next().is_none()
}

fn folds_to(c: char, n: u8) -> bool {
    match c {
        '\u{17f}' => n.eq_ignore_ascii_case(&b's'),
        '\u{212a}' => n.eq_ignore_ascii_case(&b'k'),
        c => c.is_ascii() && (c as u8).eq_ignore_ascii_case(&n),
    }
}

/// A key devgate does not read exactly: refused if Go would read it as one of `names`, or
/// crun would. crun's libocispec reads keys as yajl's C strings (`yajl_tree_get`,
/// `strcmp`, the first match wins): a key holding a NUL is the text before it there.
pub(crate) fn other<E: de::Error>(at: &'static str, names: &[&str], key: &str) -> Result<(), E> {
    let before_nul = key.split('\0').next().unwrap_or(key);
    let read = |n: &&str| go_fold_eq(key, n) || (key.contains('\0') && go_fold_eq(before_nul, n));
    match names.iter().any(read) {
        true => Err(raise(KeyFault::NonCanonical {
            key: key.to_string(),
            at,
        })),
        false => Ok(()),
    }
}

/// An object key, borrowed from the input unless it held escapes.
pub(crate) struct Key<'de>(Cow<'de, str>);

impl Key<'_> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// Implements `Deserialize` for a struct of `Default` fields read from the object at `$at`:
/// each field under its exact key once (read as `$via`, then converted), other keys skipped
/// unless Go folds them to one. Each field's name is also a local flag (seen once), so no
/// field may be called `map`, `out`, `key` or `k`.
macro_rules! go_object {
    ($ty:ident at $at:literal { $($field:ident : $name:literal as $via:ty),* $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        match $at {
                            "" => f.write_str("an object"),
                            at => write!(f, "an object ({at})"),
                        }
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> std::result::Result<$ty, A::Error> {
                        use $crate::oci::gokeys::{duplicate, other, Key};
                        let mut out = <$ty>::default();
                        $(let mut $field = false;)*
                        while let Some(key) = map.next_key::<Key<'de>>()? {
                            match key.as_str() {
                                $($name => {
                                    if std::mem::replace(&mut $field, true) {
                                        return Err(duplicate($at, $name));
                                    }
                                    out.$field = map.next_value::<$via>()?.into();
                                })*
                                k => {
                                    other($at, &[$($name),*], k)?;
                                    map.next_value::<serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
}
pub(crate) use go_object;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_as_go_strings_equal_fold() {
        assert!(go_fold_eq("Bounding", "bounding"));
        assert!(go_fold_eq("ENV", "env"));
        assert!(go_fold_eq("device\u{17f}", "devices"));
        assert!(go_fold_eq("\u{17f}ource", "source"));
        assert!(go_fold_eq("\u{212a}ey", "key"));
        assert!(go_fold_eq("\u{212a}\u{17f}", "KS"));
        assert!(go_fold_eq("env", "env"));
        // dotless i, dotted capital I: each alone in its SimpleFold orbit
        assert!(!go_fold_eq("dev\u{131}ces", "devices"));
        assert!(!go_fold_eq("dev\u{130}ces", "devices"));
        // the long s is no k, the Kelvin sign no s; no prefix, no extra rune
        assert!(!go_fold_eq("\u{17f}ey", "key"));
        assert!(!go_fold_eq("\u{212a}ource", "source"));
        assert!(!go_fold_eq("envs", "env"));
        assert!(!go_fold_eq("en", "env"));
        assert!(!go_fold_eq("en\u{17f}", "env"));
        assert!(!go_fold_eq("type_", "type"));
    }

    #[test]
    fn fault_lines_escape_the_key() {
        let f = KeyFault::NonCanonical {
            key: "Env\n".to_string(),
            at: "process",
        };
        assert_eq!(f.to_string(), r#"non-canonical key "Env\x0a" at process"#);
        let f = KeyFault::Duplicate(join("annotations", "a\u{202e}b"));
        assert_eq!(f.to_string(), r#"duplicate key "annotations.a\u{202e}b""#);
    }
}
