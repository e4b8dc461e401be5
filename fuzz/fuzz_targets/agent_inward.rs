#![no_main]

use libfuzzer_sys::fuzz_target;

// The agent's readers of ResourceSlices, DeviceTaintRules and ResourceClaims: the hook's
// file stays within its bounds (bytes, taints, strings) for any objects.
fuzz_target!(|data: &[u8]| devgate_agent::fuzzing::agent_inward(data));
