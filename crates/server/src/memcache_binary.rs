//! Ties the binary protocol (`slipstream_proto::binary`) to the store.
//! (Stub: being implemented.)

use crate::exec::{Ctx, Step};

/// Handle one binary request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let _ = (ctx, input, out);
    todo!("binary executor")
}
