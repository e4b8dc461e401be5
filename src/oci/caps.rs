//! `process.capabilities`, read in the one parse for the one thing devgate asks of it: does
//! the NVIDIA toolkit take the container for privileged (its `image.IsPrivileged`:
//! CAP_SYS_ADMIN, spelled so, in the bounding set, or in the one list of a pre-1.0 spec).
//! Nothing is kept but that answer: keeping the text to parse later cost a second scan,
//! buffering the sets for an untagged enum some 20k instructions a start. A shape that is
//! neither sets nor a list of strings is no capability, never a spec that fails; the sets'
//! keys are checked as Go reads them (`gokeys`).

use super::gokeys::{duplicate, other, Key};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// What devgate keeps of `process.capabilities`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Caps {
    /// CAP_SYS_ADMIN is in the bounding set (or the pre-1.0 list).
    pub(crate) sys_admin: bool,
}

const AT: &str = "process.capabilities";
const SETS: &[&str] = &[
    "bounding",
    "effective",
    "inheritable",
    "permitted",
    "ambient",
];

/// Visitor methods for the JSON scalars, each giving `$v`.
macro_rules! scalars {
    ($t:ty, $v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<$t, E> {
            Ok($v)
        }
    };
}

impl<'de> Deserialize<'de> for Caps {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Caps, D::Error> {
        d.deserialize_any(CapsVisitor)
    }
}

struct CapsVisitor;

impl<'de> Visitor<'de> for CapsVisitor {
    type Value = Caps;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("capabilities")
    }
    scalars!(Caps, Caps::default());
    fn visit_str<E>(self, _: &str) -> Result<Caps, E> {
        Ok(Caps::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Caps, A::Error> {
        NamesVisitor
            .visit_seq(seq)
            .map(|sys_admin| Caps { sys_admin })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Caps, A::Error> {
        let mut seen = 0u8;
        let mut out = Caps::default();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let k = key.as_str();
            match SETS.iter().position(|n| *n == k) {
                Some(i) if seen & (1 << i) != 0 => return Err(duplicate(AT, k)),
                Some(i) => seen |= 1 << i,
                None => other(AT, SETS, k)?,
            }
            match k {
                "bounding" => out.sys_admin = map.next_value::<Names>()?.0,
                _ => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(out)
    }
}

/// A list of capability names: whether it is all strings and holds CAP_SYS_ADMIN.
struct Names(bool);

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Names, D::Error> {
        d.deserialize_any(NamesVisitor).map(Names)
    }
}

struct NamesVisitor;

impl<'de> Visitor<'de> for NamesVisitor {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of capabilities")
    }
    scalars!(bool, false);
    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        // as the toolkit's []string: one name that is not a string and there is no list
        let (mut found, mut strings) = (false, true);
        while let Some(name) = seq.next_element::<Name>()? {
            match name {
                Name::SysAdmin => found = true,
                Name::Other => {}
                Name::NotAString => strings = false,
            }
        }
        Ok(found && strings)
    }
}

enum Name {
    SysAdmin,
    Other,
    NotAString,
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        d.deserialize_any(NameVisitor)
    }
}

struct NameVisitor;

impl<'de> Visitor<'de> for NameVisitor {
    type Value = Name;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a capability")
    }
    scalars!(Name, Name::NotAString);
    fn visit_str<E>(self, s: &str) -> Result<Name, E> {
        Ok(match s {
            "CAP_SYS_ADMIN" => Name::SysAdmin,
            _ => Name::Other,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Name, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Name::NotAString)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Name, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Name::NotAString)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sys_admin(json: &str) -> bool {
        serde_json::from_str::<Caps>(json).unwrap().sys_admin
    }

    #[test]
    fn only_the_bounding_set_or_the_one_list_of_strings_counts() {
        assert!(sys_admin(r#"{"bounding":["CAP_KILL","CAP_SYS_ADMIN"]}"#));
        assert!(sys_admin(r#"["CAP_SYS_ADMIN"]"#));
        assert!(!sys_admin(r#"{"effective":["CAP_SYS_ADMIN"]}"#));
        assert!(!sys_admin(r#"{"bounding":["CAP_SYS_ADMIN",1]}"#));
        assert!(!sys_admin(r#"{"bounding":"CAP_SYS_ADMIN","x":{"y":[1]}}"#));
        assert!(!sys_admin(r#"["cap_sys_admin",["CAP_SYS_ADMIN"]]"#));
        assert!(!sys_admin("5"));
        assert!(!sys_admin("null"));
    }
}
