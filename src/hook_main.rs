// `devgate-hook`, the hook front: what the shipped hook files run on every container start
// (oci-hooks.d, containerd's base spec). build.rs links it statically (static-pie): no
// dynamic loader binding libc's symbols and no libc to map and relocate, which inside
// `runc run` was most of what a hook of a container with no devices cost over /bin/true
// (docs/changelog.md). It runs `devgate hook STAGE` itself for every container whose
// spec names no NVIDIA device. A static glibc program cannot load NVML, so a container
// that may have one, and every other command, goes to the dynamically linked devgate
// beside it, with the same arguments (and the state it read, as its stdin).
// Start-up trick (docs/performance.md). Plain: `fn main`.
#![no_main]

use std::time::Instant;

#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    let started = Instant::now();
    devgate::cli::process_start();
    devgate::cli::run_program(|| devgate::cli::hook_front(devgate::cli::utf8_args(), started))
}
