//! Ties the text and meta protocols (`slipstream_proto::{text, meta}`) to the store.
//! (Stub: being implemented.)

use crate::exec::{Ctx, Step};

/// Handle one text or meta request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let _ = (ctx, input, out);
    todo!("text executor")
}
