// `devgate-runtime`, the OCI runtime wrapper, as a program of its own: every container of
// a runtime configured with it starts through it (containerd's BinaryName, CRI-O's
// runtime_path, podman's --runtime), most of them with no device to gate, so what it costs
// is what starting it costs. build.rs links it statically (static-pie): no dynamic loader
// binding a hundred and forty libc symbols and no libc to map, which was most of the
// wrapper's cost above the floor of any program that execs the runtime
// (docs/changelog.md). A static glibc program cannot load NVML, so a create whose spec
// names devices is handed to `devgate runtime` (the dynamically linked devgate, beside
// this program), which gates it with the hooks' code and execs the runtime itself.
// Start-up trick (docs/performance.md). Plain: `fn main`.
#![no_main]

use std::time::Instant;

#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    let started = Instant::now();
    devgate::cli::process_start();
    devgate::cli::run_program(|| run(started))
}

fn run(started: Instant) -> i32 {
    let argv = devgate::cli::utf8_args();
    devgate::wrapper::main(&argv, None, started, devgate::wrapper::GateIn::Devgate)
}
