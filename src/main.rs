// devgate runs on every container start, where a few hundred microseconds matter (issue 9,
// docs/changelog.md). Rust's runtime start (`fn main` through lang_start) sets up a
// stack-overflow guard for the main thread, and glibc finds that thread's stack by reading
// and sscanf-parsing all of /proc/self/maps: a tenth of the hook's instructions. So devgate
// has a C `main` instead. std still works without lang_start on Linux (arguments come from
// glibc's init_array); what lang_start did that devgate relies on is done by hand below.
// Start-up trick (docs/performance.md). Plain: `fn main`.
#![no_main]

use std::time::Instant;

#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    let started = Instant::now();
    devgate::cli::process_start();
    // The NVML query process (gpu::nvml::isolate) forks one child per GPU, so it
    // runs before anything could start a thread.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(devgate::NVML_QUERY_ARG)) {
        devgate::serve_nvml_query(&args.collect::<Vec<_>>());
    }
    devgate::cli::run_program(|| run(started))
}

fn run(started: Instant) -> i32 {
    let argv0 = std::env::args_os().next();
    let argv = devgate::cli::utf8_args();
    // Linked as `devgate-runtime` (the packages install a program of that name instead:
    // src/runtime_main.rs): the OCI runtime wrapper, gating in this process.
    if devgate::wrapper::invoked_as_runtime(argv0.as_deref()) {
        devgate::wrapper::main(&argv, None, started, devgate::wrapper::GateIn::Here)
    } else {
        devgate::cli::main(argv, started)
    }
}
