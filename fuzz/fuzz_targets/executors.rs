//! Coverage-guided fuzz target for longer runs (`make fuzz`): arbitrary bytes, delivered whole
//! and then split at the positions the first byte selects, through the text/meta/binary
//! executors. Panics and out-of-range consumption are the bugs it looks for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slipstream_server::harness::Harness;

fuzz_target!(|data: &[u8]| {
    let Some((&split, input)) = data.split_first() else { return };
    let mut whole = Harness::small();
    let _ = whole.feed(input);
    let step = usize::from(split % 31) + 1;
    let mut parts = Harness::small();
    for chunk in input.chunks(step) {
        let _ = parts.feed(chunk);
    }
});
