//! How the commands end and what they print: stdout that fails cleanly when its reader
//! is gone, one escaped error line, the exit. A leaf, so every command imports it and not
//! `cli`, which dispatches to them.

use crate::error::Error;
use std::io::Write;

/// Ends the process with `code`.
pub fn exit(code: i32) -> ! {
    if super::doctor::nvml::nvml_abandoned() {
        // doctor's NVML call is still stuck on its thread: exit() would run the library's
        // destructors under it, and those may wait on it forever. Nothing devgate wrote
        // needs atexit: records are fsynced, stdout and stderr are flushed here. (The hook
        // never loads NVML: its queries run in processes of their own.)
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: _exit ends the process at once; no Rust state is used after it.
        unsafe { libc::_exit(code) }
    }
    std::process::exit(code);
}

/// Writes to stdout. When the reader is gone (`devgate status | head`), the command ends
/// with one error line and status 2, like any other failure: println! would panic, and the
/// panic hook's "internal error, please report" would blame devgate for the reader.
pub(crate) fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        drop(out);
        fail(&Error::io(
            "cannot write",
            std::path::Path::new("stdout"),
            e,
        ));
        exit(2);
    }
}

/// The error line and exit status every devgate program shares, written once in the front
/// (the layer below cli that the hook front's own failures go through).
pub(crate) use crate::front::fail;
