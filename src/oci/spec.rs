//! The few fields of a bundle's config.json that devgate reads. Every field is optional and
//! unknown fields are ignored, so configs from any runtime and spec version parse; only a
//! field devgate itself uses can make the parse fail, and then the error says where. A key
//! on those paths that comes twice, or that Go's encoding/json (runc's, the NVIDIA
//! toolkit's) folds to one devgate reads, fails it too (`gokeys`).

use super::caps::Caps;
use super::gokeys::{self, duplicate, go_object, Key};
use crate::error::{Error, Result};
use crate::fsutil::read_regular_file;
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub(crate) const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A CRI annotation whose containerd key and CRI-O key hold different values
/// (`Spec::cri_annotation`): one of them is the pod's own forgery, so neither names
/// anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationConflict {
    /// containerd's key.
    pub containerd: String,
    /// CRI-O's key.
    pub crio: String,
}

impl fmt::Display for AnnotationConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the annotations {} and {} disagree (one is the pod's own)",
            self.containerd, self.crio
        )
    }
}

impl std::error::Error for AnnotationConflict {}

// Every struct below is read by `go_object!`: exact keys once each, a key Go's
// encoding/json would fold to one of them refused (see gokeys).

#[derive(Debug, Default, Clone)]
pub struct Spec {
    pub oci_version: String,
    pub process: Option<Process>,
    pub root: Option<Root>,
    pub mounts: Vec<Mount>,
    pub annotations: BTreeMap<String, String>,
    pub linux: Option<Linux>,
}

go_object!(Spec at "" {
    oci_version: "ociVersion" as String,
    process: "process" as Option<Process>,
    root: "root" as Option<Root>,
    mounts: "mounts" as Vec<Mount>,
    annotations: "annotations" as Annotations,
    linux: "linux" as Option<Linux>,
});

#[derive(Debug, Default, Clone)]
pub struct Process {
    pub env: Vec<String>,
    /// Read only for the NVIDIA toolkit's test of a privileged container
    /// ([`Spec::privileged_to_nvidia`]): whether CAP_SYS_ADMIN is in the bounding set.
    capabilities: Option<Caps>,
}

go_object!(Process at "process" {
    env: "env" as Vec<String>,
    capabilities: "capabilities" as Option<Caps>,
});

/// `annotations`: a key twice is refused. Go keeps the last, as serde would, but JSON
/// readers disagree on which of two counts (RFC 8259 leaves it open), and no runtime writes one.
#[derive(Default)]
struct Annotations(BTreeMap<String, String>);

impl From<Annotations> for BTreeMap<String, String> {
    fn from(a: Annotations) -> Self {
        a.0
    }
}

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Annotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Annotations, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = map.next_key::<Key<'de>>()? {
                    let v: String = map.next_value()?;
                    if out.insert(k.as_str().to_string(), v).is_some() {
                        return Err(duplicate("annotations", k.as_str()));
                    }
                }
                Ok(Annotations(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Debug, Default, Clone)]
pub struct Root {
    pub path: PathBuf,
}

go_object!(Root at "root" { path: "path" as PathBuf });

#[derive(Debug, Default, Clone)]
pub struct Mount {
    pub destination: PathBuf,
    pub typ: Option<String>,
    pub source: Option<PathBuf>,
    pub options: Vec<String>,
}

go_object!(Mount at "mounts[*]" {
    destination: "destination" as PathBuf,
    typ: "type" as Option<String>,
    source: "source" as Option<PathBuf>,
    options: "options" as Vec<String>,
});

impl Mount {
    pub(crate) fn is_bind(&self) -> bool {
        self.typ.as_deref() == Some("bind")
            || self.options.iter().any(|o| o == "bind" || o == "rbind")
    }
}

#[derive(Debug, Default, Clone)]
pub struct Linux {
    pub devices: Vec<LinuxDevice>,
    pub resources: Option<Resources>,
    pub cgroups_path: Option<String>,
    pub namespaces: Vec<Namespace>,
}

go_object!(Linux at "linux" {
    devices: "devices" as Vec<LinuxDevice>,
    resources: "resources" as Option<Resources>,
    cgroups_path: "cgroupsPath" as Option<String>,
    namespaces: "namespaces" as Vec<Namespace>,
});

/// A `linux.namespaces` entry; only its type matters here.
#[derive(Debug, Default, Clone)]
pub struct Namespace {
    pub typ: String,
}

go_object!(Namespace at "linux.namespaces[*]" {
    typ: "type" as String,
});

/// A `linux.devices` entry. Numbers are read wide so that an absurd value becomes a clear
/// error from discovery instead of a parse failure with no device named.
#[derive(Debug, Default, Clone)]
pub struct LinuxDevice {
    pub path: PathBuf,
    pub typ: String,
    pub major: i64,
    pub minor: i64,
    pub file_mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

go_object!(LinuxDevice at "linux.devices[*]" {
    path: "path" as PathBuf,
    typ: "type" as String,
    major: "major" as i64,
    minor: "minor" as i64,
    file_mode: "fileMode" as Option<u32>,
    uid: "uid" as Option<u32>,
    gid: "gid" as Option<u32>,
});

#[derive(Debug, Default, Clone)]
pub struct Resources {
    pub devices: Vec<LinuxDeviceCgroup>,
}

go_object!(Resources at "linux.resources" { devices: "devices" as Rules });

/// `linux.resources.devices`: read as oci-spec's rules, each through the same key check.
#[derive(Default)]
struct Rules(Vec<Rule>);

impl From<Rules> for Vec<LinuxDeviceCgroup> {
    fn from(r: Rules) -> Self {
        r.0.into_iter().map(LinuxDeviceCgroup::from).collect()
    }
}

impl<'de> Deserialize<'de> for Rules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Vec::deserialize(d).map(Rules)
    }
}

/// One cgroup device rule, oci-spec's fields under their exact keys.
#[derive(Default)]
struct Rule {
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: Option<String>,
}

go_object!(Rule at "linux.resources.devices[*]" {
    allow: "allow" as bool,
    typ: "type" as Option<LinuxDeviceType>,
    major: "major" as Option<i64>,
    minor: "minor" as Option<i64>,
    access: "access" as Option<String>,
});

impl From<Rule> for LinuxDeviceCgroup {
    fn from(r: Rule) -> Self {
        let mut out = LinuxDeviceCgroup::default();
        out.set_allow(r.allow)
            .set_typ(r.typ)
            .set_major(r.major)
            .set_minor(r.minor)
            .set_access(r.access);
        out
    }
}

impl Spec {
    /// A key runc would read otherwise than devgate is one line naming the file and the key.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Spec> {
        gokeys::take_fault();
        let spec: Spec = serde_json::from_slice(bytes).map_err(|e| match gokeys::take_fault() {
            Some(fault) => Error::invalid(path.display().to_string(), fault.to_string()),
            None => Error::json("cannot parse", Some(path), &e),
        })?;
        match spec.nul_in_paths() {
            Some(field) => Err(Error::invalid(
                path.display().to_string(),
                format!("{field} holds a NUL byte: crun reads only the text before it"),
            )),
            None => Ok(spec),
        }
    }

    /// The first device or mount path holding a NUL: crun reads its C string up to it
    /// (another node than the one devgate would stat), runc's system calls refuse it.
    fn nul_in_paths(&self) -> Option<&'static str> {
        let nul = |p: &Path| p.as_os_str().as_encoded_bytes().contains(&0);
        if self.devices().iter().any(|d| nul(&d.path)) {
            return Some("a linux.devices path");
        }
        self.mounts
            .iter()
            .any(|m| nul(&m.destination) || m.source.as_deref().is_some_and(nul))
            .then_some("a mount's source or destination")
    }

    pub fn load(bundle: &Path) -> Result<Spec> {
        Spec::read(&bundle.join("config.json")).map(|(s, _)| s)
    }

    /// The spec file and its bytes (the runtime wrapper's marker names them by digest).
    pub fn read(path: &Path) -> Result<(Spec, Vec<u8>)> {
        let bytes = read_regular_file(path, MAX_CONFIG_BYTES, "bundle config")?;
        Ok((Spec::parse(&bytes, path)?, bytes))
    }

    pub fn devices(&self) -> &[LinuxDevice] {
        self.linux.as_ref().map(|l| &l.devices[..]).unwrap_or(&[])
    }

    /// The container gets a user namespace of its own (Kubernetes `hostUsers: false`).
    pub fn user_namespace(&self) -> bool {
        self.linux
            .as_ref()
            .is_some_and(|l| l.namespaces.iter().any(|n| n.typ == "user"))
    }

    pub(crate) fn device_rules(&self) -> &[LinuxDeviceCgroup] {
        self.linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(|r| &r.devices[..])
            .unwrap_or(&[])
    }

    /// Whether the container holds every device, as every runtime reads the rules: they
    /// apply in order, and the last rule over every device (type `a` or none, no major or
    /// minor or -1) is an allow of `rwm`. That is how containerd's and CRI-O's CRI, podman
    /// `--privileged` and runc mark a privileged container, which also gets every host
    /// node in `linux.devices`. A later deny over every device undoes it; crun on cgroup
    /// v2 reads a type-`a` rule by its numbers and access, so one with numbers or less
    /// than `rwm` is no allow-all there and counts for none here.
    pub fn holds_every_device(&self) -> bool {
        use oci_spec::runtime::LinuxDeviceType as T;
        let every = |r: &&LinuxDeviceCgroup| {
            let any = |n: Option<i64>| !matches!(n, Some(n) if n != -1);
            matches!(r.typ(), None | Some(T::A)) && any(r.major()) && any(r.minor())
        };
        self.device_rules().iter().rfind(every).is_some_and(|r| {
            let access = r.access().as_deref().unwrap_or("");
            r.allow() && ['r', 'w', 'm'].iter().all(|c| access.contains(*c))
        })
    }

    /// Annotations from the state win over config.json's: the runtime may add some.
    pub fn annotation<'a>(
        &'a self,
        state: &'a BTreeMap<String, String>,
        key: &str,
    ) -> Option<&'a str> {
        state
            .get(key)
            .or_else(|| self.annotations.get(key))
            .map(String::as_str)
    }

    /// A CRI annotation that containerd sets under one key and CRI-O under another
    /// (`keys`: containerd's, CRI-O's). Each runtime sets its own key after the pod's
    /// annotations, but not the other's, and CRI-O copies every pod annotation into the
    /// spec: there containerd's key is the pod author's to write. A value under both keys
    /// that differs is therefore forged under one of them, and names nothing.
    pub(crate) fn cri_annotation<'a>(
        &'a self,
        state: &'a BTreeMap<String, String>,
        (containerd, crio): (&str, &str),
    ) -> std::result::Result<Option<&'a str>, AnnotationConflict> {
        match (
            self.annotation(state, containerd),
            self.annotation(state, crio),
        ) {
            (Some(a), Some(b)) if a != b => Err(AnnotationConflict {
                containerd: containerd.to_string(),
                crio: crio.to_string(),
            }),
            (a, b) => Ok(a.or(b)),
        }
    }

    /// Whether NVIDIA's container toolkit takes this container for a privileged one (its
    /// `image.IsPrivileged`): CAP_SYS_ADMIN, spelled so, in the bounding set (or the one
    /// list of a pre-1.0 spec). Then the toolkit honours `NVIDIA_VISIBLE_DEVICES` whatever
    /// its `accept-nvidia-visible-devices-envvar-when-unprivileged` says.
    pub(crate) fn privileged_to_nvidia(&self) -> bool {
        self.process
            .as_ref()
            .and_then(|p| p.capabilities)
            .is_some_and(|c| c.sys_admin)
    }

    /// The value of every variable whose name begins with `prefix` and is longer, each name
    /// once with its last value (as the NVIDIA toolkit's environment map keeps it), in the
    /// order of their last settings.
    pub fn env_with_prefix(&self, prefix: &str) -> Vec<(&str, &str)> {
        let Some(p) = self.process.as_ref() else {
            return Vec::new();
        };
        let mut out: Vec<(&str, &str)> = Vec::new();
        for kv in p.env.iter().rev() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            if k.len() > prefix.len() && k.starts_with(prefix) && !out.iter().any(|(o, _)| *o == k)
            {
                out.push((k, v));
            }
        }
        out.reverse();
        out
    }

    pub fn env(&self, key: &str) -> Option<&str> {
        let env = &self.process.as_ref()?.env;
        env.iter().rev().find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then_some(v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allow-all rule every CRI, podman `--privileged` and runc give a privileged
    /// container; a wildcard of one type, a deny, or a numbered rule is not one.
    #[test]
    fn holds_every_device_is_an_allow_all_rule() {
        let holds = |rules: &str| {
            let json = format!(r#"{{"linux":{{"resources":{{"devices":{rules}}}}}}}"#);
            Spec::parse(json.as_bytes(), Path::new("/b/config.json"))
                .unwrap()
                .holds_every_device()
        };
        assert!(holds(r#"[{"allow":true,"access":"rwm"}]"#));
        assert!(holds(
            r#"[{"allow":false,"access":"rwm"},{"allow":true,"type":"a","major":-1,"access":"rwm"}]"#
        ));
        assert!(!holds(r#"[{"allow":false,"access":"rwm"}]"#));
        assert!(!holds(r#"[{"allow":true,"type":"c","access":"rwm"}]"#));
        assert!(!holds(
            r#"[{"allow":true,"type":"c","major":195,"minor":0,"access":"rw"}]"#
        ));
        // undone by a later deny over every device: runc and crun apply rules in order
        assert!(!holds(
            r#"[{"allow":true,"access":"rwm"},{"allow":false,"access":"rwm"},
                {"allow":true,"type":"c","major":195,"minor":2,"access":"rwm"}]"#
        ));
        // crun on cgroup v2 reads type a by its numbers and access
        assert!(!holds(
            r#"[{"allow":true,"type":"a","major":195,"minor":2,"access":"rwm"}]"#
        ));
        assert!(!holds(r#"[{"allow":true,"type":"a","access":"m"}]"#));
        assert!(!holds(r#"[{"allow":true,"type":"a"}]"#));
        assert!(!holds("[]"));
    }

    #[test]
    fn a_user_namespace_is_seen() {
        let s = |j: &str| Spec::parse(j.as_bytes(), Path::new("c.json")).unwrap();
        assert!(s(r#"{"linux":{"namespaces":[{"type":"pid"},{"type":"user"}]}}"#).user_namespace());
        assert!(
            !s(r#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#)
                .user_namespace()
        );
        assert!(!s(r#"{"linux":{}}"#).user_namespace());
        assert!(!s("{}").user_namespace());
    }

    #[test]
    fn tolerates_unknown_capabilities_namespaces_and_fields() {
        let s = Spec::parse(
            br#"{"ociVersion":"1.0.0-rc5","process":{"env":["A=1","NVIDIA_VISIBLE_DEVICES=0,1"],
                "capabilities":{"bounding":["CAP_FUTURE_THING"]}},
                "linux":{"namespaces":[{"type":"timewarp"}],
                "devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1,"fileMode":438}],
                "resources":{"devices":[{"allow":false,"access":"rwm"},
                                        {"allow":true,"type":"c","major":195,"minor":1,"access":"rw"}]}},
                "somethingNew":true}"#,
            Path::new("/b/config.json"),
        )
        .unwrap();
        assert_eq!(s.devices().len(), 1);
        assert_eq!(s.device_rules().len(), 2);
        assert_eq!(s.env("NVIDIA_VISIBLE_DEVICES"), Some("0,1"));
    }

    #[test]
    fn parse_error_names_file_and_position() {
        let e = Spec::parse(
            b"{\"linux\": {\"devices\": [1]}}",
            Path::new("/b/config.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("cannot parse /b/config.json: line 1 column"),
            "{e}"
        );
    }

    /// The one line a spec that runc (Go's encoding/json) and devgate would read apart gets.
    fn refused(json: &str) -> String {
        match Spec::parse(json.as_bytes(), Path::new("/b/config.json")) {
            Ok(_) => panic!("accepted: {json}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_key_go_folds_to_a_read_one_is_refused() {
        // runc and the NVIDIA toolkit match keys case-insensitively; serde, crun exactly
        let e = refused(r#"{"process":{"capabilities":{"Bounding":["CAP_SYS_ADMIN"]}}}"#);
        assert_eq!(
            e,
            r#"/b/config.json: non-canonical key "Bounding" at process.capabilities"#
        );
        let e = refused(r#"{"process":{"ENV":["NVIDIA_VISIBLE_DEVICES=all"]}}"#);
        assert_eq!(e, r#"/b/config.json: non-canonical key "ENV" at process"#);
        let e = refused(r#"{"Linux":{"devices":[]}}"#);
        assert_eq!(
            e,
            r#"/b/config.json: non-canonical key "Linux" at (top level)"#
        );
        // U+017F (long s) folds to s in Go: "deviceſ" is runc's "devices"
        let e = refused("{\"linux\":{\"device\u{17f}\":[{\"path\":\"/dev/nvidia0\"}]}}");
        assert_eq!(
            e,
            "/b/config.json: non-canonical key \"device\u{17f}\" at linux"
        );
        let e = refused(r#"{"mounts":[{"destination":"/d","Source":"/dev"}]}"#);
        assert_eq!(
            e,
            r#"/b/config.json: non-canonical key "Source" at mounts[*]"#
        );
        let e = refused(r#"{"linux":{"resources":{"devices":[{"allow":true,"Major":195}]}}}"#);
        assert_eq!(
            e,
            r#"/b/config.json: non-canonical key "Major" at linux.resources.devices[*]"#
        );
    }

    #[test]
    fn a_duplicate_key_on_a_read_path_is_refused() {
        // runc: the last "bounding" wins (a privileged container to the toolkit)
        let e =
            refused(r#"{"process":{"capabilities":{"bounding":[],"bounding":["CAP_SYS_ADMIN"]}}}"#);
        assert_eq!(
            e,
            r#"/b/config.json: duplicate key "process.capabilities.bounding""#
        );
        // runc merges the two objects: both devices lists' owners are one "linux"
        let e = refused(r#"{"linux":{"devices":[]},"linux":{"cgroupsPath":"/x"}}"#);
        assert_eq!(e, r#"/b/config.json: duplicate key "linux""#);
        let e = refused(r#"{"process":{"env":["A=1"],"env":["B=2"]}}"#);
        assert_eq!(e, r#"/b/config.json: duplicate key "process.env""#);
        let e = refused(r#"{"annotations":{"a":"1","b":"2","a":"3"}}"#);
        assert_eq!(e, r#"/b/config.json: duplicate key "annotations.a""#);
        let e = refused(r#"{"linux":{"devices":[{"path":"/dev/a","path":"/dev/b"}]}}"#);
        assert_eq!(
            e,
            r#"/b/config.json: duplicate key "linux.devices[*].path""#
        );
    }

    #[test]
    fn keys_go_does_not_fold_and_unread_ones_still_parse() {
        // U+0131 (dotless i) is in no SimpleFold orbit with i: runc ignores it too
        let s = Spec::parse(
            "{\"linux\":{\"dev\u{131}ces\":[{\"path\":\"/dev/x\"}]},\
              \"hostname\":\"a\",\"hostname\":\"b\",\"Hostname\":\"c\",\
              \"process\":{\"args\":[\"a\"],\"Args\":[\"b\"]},\
              \"annotations\":{\"a\":\"1\",\"A\":\"2\"}}"
                .as_bytes(),
            Path::new("/b/config.json"),
        )
        .unwrap();
        assert!(s.devices().is_empty());
        assert_eq!(s.annotations.len(), 2);
    }

    /// crun reads config.json with yajl into C strings: a key holding a NUL is the text
    /// before it to crun (`strcmp`, the first match wins), while serde and Go read another
    /// key. So `"devices\u0000"` is crun's `linux.devices`, and `"minor\u0000"` before
    /// `"minor"` crun's minor. A path holding a NUL is the text before it to crun too.
    #[test]
    fn a_key_or_path_crun_reads_up_to_a_nul_is_refused() {
        let e = refused(
            r#"{"linux":{"devices\u0000":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}}"#,
        );
        assert_eq!(
            e,
            r#"/b/config.json: non-canonical key "devices\x00" at linux"#
        );
        let e = refused(
            r#"{"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,
                "minor\u0000x":1,"minor":5,"access":"rw"}]}}}"#,
        );
        assert!(e.contains(r#"non-canonical key "minor\x00x""#), "{e}");
        let e = refused(
            r#"{"linux":{"devices":[{"path":"/dev/nvidia1\u0000x","type":"c","major":1,"minor":3}]}}"#,
        );
        assert!(e.contains("holds a NUL byte"), "{e}");
        let e = refused(r#"{"mounts":[{"destination":"/d","source":"/dev/nvidia1\u0000"}]}"#);
        assert!(e.contains("holds a NUL byte"), "{e}");
        // a NUL in a key devgate and crun read nowhere is no one's field
        Spec::parse(
            br#"{"hostname\u0000":"x","process":{"args\u0000":["a"]}}"#,
            Path::new("/b/config.json"),
        )
        .unwrap();
    }

    #[test]
    fn bind_detection() {
        let m: Mount =
            serde_json::from_str(r#"{"destination":"/d","source":"/s","options":["rbind","ro"]}"#)
                .unwrap();
        assert!(m.is_bind());
        let m: Mount = serde_json::from_str(r#"{"destination":"/proc","type":"proc"}"#).unwrap();
        assert!(!m.is_bind());
    }
}
