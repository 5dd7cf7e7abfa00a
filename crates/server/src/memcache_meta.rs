//! Ties the meta protocol (`slipstream_proto::meta`: mg, ms, md, ma, mn, me) to the store.
//! (Stub: being implemented.) `memcache_text::execute` hands a request here when its command
//! word is a meta command.

use crate::exec::{Ctx, Step};

/// Handle one meta request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let _ = (ctx, input, out);
    todo!("meta executor")
}
