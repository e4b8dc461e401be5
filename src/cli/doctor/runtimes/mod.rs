//! Is each runtime on the node wired to devgate? The pure judges take what was read
//! (oci-hooks files, containerd's `config dump`, CRI-O's and NVIDIA's TOML) and a predicate
//! that says whether a path is devgate; the readers next to them do the bounded I/O.
//!
//! This file holds the plumbing they share: finding a binary as the runtime would, reading a
//! small file, wording a TOML error on one line. Each runtime family has a file of its own.

pub(crate) mod binary;
pub(crate) mod containerd;
pub(crate) mod crio;
mod files;
pub(crate) mod go_match;
pub(crate) mod hooks;
pub(crate) mod podman;

#[cfg(test)]
pub(crate) use files::MAX_SMALL_FILE;
pub(crate) use files::{read_opened, read_small, which};
