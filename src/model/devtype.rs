//! Character or block: the one part of a device's number its class needs too. A leaf,
//! so `class` and `device` both take it and neither imports the other back.

use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::FileTypeExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DevType {
    #[serde(rename = "c")]
    Char,
    #[serde(rename = "b")]
    Block,
}

impl DevType {
    pub(crate) fn letter(self) -> char {
        match self {
            DevType::Char => 'c',
            DevType::Block => 'b',
        }
    }

    pub(crate) fn sysfs_dir(self) -> &'static str {
        match self {
            DevType::Char => "char",
            DevType::Block => "block",
        }
    }

    pub(crate) fn of_metadata(meta: &fs::Metadata) -> Option<DevType> {
        let ft = meta.file_type();
        if ft.is_char_device() {
            Some(DevType::Char)
        } else if ft.is_block_device() {
            Some(DevType::Block)
        } else {
            None
        }
    }
}
