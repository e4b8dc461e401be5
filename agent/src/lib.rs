//! The parts of devgate-agent that read what others write, with no Kubernetes client:
//! the DRA objects (`dra`), the hook's file built from them (`inward`), devgate's status
//! (`verdicts`). A library so that the fuzz targets (fuzz/) reach them.

pub mod dra;
pub mod fuzzing;
pub mod inward;
pub mod verdicts;
