//! TEMPORARY mirror of devgate::store::cluster until the hook side lands.
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileEffect {
    None,
    NoSchedule,
    NoExecute,
}
impl FileEffect {
    pub fn parse(s: &str) -> Option<FileEffect> {
        match s {
            "None" => Some(FileEffect::None),
            "NoSchedule" => Some(FileEffect::NoSchedule),
            "NoExecute" => Some(FileEffect::NoExecute),
            _ => None,
        }
    }
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTaint {
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub device: String,
    pub driver: String,
    pub pool: String,
    pub key: String,
    pub value: String,
    pub effect: FileEffect,
    pub source: String,
    pub tolerated_by: Vec<String>,
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaintFile {
    pub node: String,
    pub written_unix: u64,
    pub taints: Vec<FileTaint>,
}
pub fn write(path: &Path, f: &TaintFile) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(f).unwrap()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}
pub fn write_status(path: &Path, r: &crate::report::Report) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(r).unwrap()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}
