#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| devgate::fuzzing::kubelet_config(data));
