//! The TCP loop: what a worker does when a connection is readable or writable.
//!
//! What it is for: rounds of plan → read → execute → charge → flush. The gate plans the round
//! from the tenant's shaper (nothing to plan without one), the connection reads what the socket
//! has within the plan, every complete request in the buffer runs through
//! `dispatch::execute_one` (the batch), the shaper is charged for what was read and produced,
//! and all of the batch's replies go out with one write. Replies never wait for a later
//! request: the flush ends the round that produced them.
//!
//! What it is not for: accepting (listen.rs), buffer mechanics (conn.rs), the shaping decision
//! (gate.rs) or protocol rules (the executors).

use super::conn::{Conn, InFlight, WRITE_BUF_BYTES_HIGH};
use super::env::{thread_stats, Env, Slot};
use super::gate::{self, RoundPlan};
use crate::dispatch::{execute_authenticating, execute_one};
use crate::exec::Protocol;
use crate::exec::{Ctx, Settings, Step};
use crate::memcache_admin::{self, DUMP_PENDING_BYTES_MAX};
use crate::memcache_text;
use crate::outq::SHARE_VALUE_BYTES_MIN;
use crate::replicated::{self, Delivery, Fail, Outcome, Replica, Route};
use crate::stats::ThreadStats;
use crate::tenants::Tenant;
use crate::watch::CloseReason;
use mio::{Interest, Registry, Token};
use slipstream_tenancy::since_start_ns;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes of a proposed request kept to answer a failure (a text line, a binary header).
const HEAD_BYTES_MAX: usize = 2048;

/// What handling an event decided for a connection.
pub(super) enum After {
    Keep,
    Close,
    /// `watch` was accepted: hand the connection to the log writer (its watcher id).
    Watch(u64),
}

/// How a batch ended.
#[derive(Default)]
struct BatchEnd {
    /// Stopped because too many reply bytes wait for the socket (input may remain).
    high: bool,
    /// Stopped at the shaper's limits (input remains).
    limited: bool,
    requests: u32,
    reply_bytes: u64,
}

/// An event on connection `idx` (in `slot`). `peer_closed`: the event says the peer shut its
/// side (EPOLLRDHUP) or the socket failed; then we read to the end, so data and end-of-file
/// that arrive together are both seen.
pub(super) fn conn_event(
    slot: &mut Slot,
    idx: usize,
    registry: &Registry,
    env: &Env<'_>,
    readable: bool,
    writable: bool,
    peer_closed: bool,
) -> After {
    let Slot { tenant, conn } = slot;
    {
        if writable && conn.blocked_on_write {
            match conn.flush(thread_stats(tenant, env.index), env.settings) {
                Ok(true) => {
                    conn.gate.flushed(tenant.shaper.as_deref());
                    if conn.close_after_flush {
                        return After::Close;
                    }
                    conn.blocked_on_write = false;
                    if registry.reregister(&mut conn.stream, Token(idx), Interest::READABLE).is_err() {
                        return After::Close;
                    }
                    if conn.gate.in_throttled {
                        // Its turn comes from the throttled list.
                        return After::Keep;
                    }
                    // Input may have piled up while we were blocked; execute it now.
                    return serve(conn, tenant, idx, registry, env, true, peer_closed);
                }
                Ok(false) => return After::Keep,
                Err(_) => return After::Close,
            }
        }
        if readable && !conn.blocked_on_write {
            if conn.gate.in_throttled && !peer_closed {
                // Held back: the bytes wait in the socket (back-pressure); the throttled list
                // brings it back when its tenant has tokens again.
                return After::Keep;
            }
            return serve(conn, tenant, idx, registry, env, true, peer_closed);
        }
        After::Keep
    }
}

/// Whether input the executor left unconsumed is a request whose command is read and whose
/// data is not (for `stats conns`' `conn_nread`): a whole text line (only a storage command
/// leaves one unconsumed) or a whole binary header.
fn awaits_data(pending: &[u8]) -> bool {
    match pending.first() {
        None => false,
        Some(&0x80) => pending.len() >= 24,
        Some(_) => pending.contains(&b'\n'),
    }
}

/// Rounds of plan → read → execute → charge → flush while the socket may hold more and the
/// event's round budget lasts. A connection the gate holds back gets `throttle_until_ns`.
pub(super) fn serve(
    conn: &mut Conn,
    tenant: &Tenant,
    idx: usize,
    registry: &Registry,
    env: &Env<'_>,
    mut want_read: bool,
    peer_closed: bool,
) -> After {
    let stats = thread_stats(tenant, env.index);
    let shaper = tenant.shaper.as_deref();
    for _ in 0..conn.gate.rounds() {
        // A parked connection reads nothing (bounded: its input waits in the socket); the
        // outcome's delivery serves it again with a read.
        want_read &= !conn.repl.parked;
        // plan
        let mut plan = match shaper {
            Some(sh) => gate::plan(sh, since_start_ns(), conn.gate.held, want_read),
            None => RoundPlan::open(want_read),
        };
        plan.limits = gate::cap_requests(plan.limits, per_event_limit(env.settings));
        // read
        let read = if plan.read {
            conn.read_round(plan.read_budget, env.read_buf_bytes_max, &env.settings.conn_buf, peer_closed, stats)
        } else {
            Default::default()
        };
        if read.failed {
            return After::Close;
        }
        if conn.rend > conn.rstart {
            // Once per batch, not per request: `stats conns` only needs seconds.
            conn.last_cmd.mark(tenant.info.uptime_s());
        }
        // execute
        let batch =
            if plan.execute { execute_batch(conn, tenant, idx, stats, env, plan.limits) } else { BatchEnd::default() };
        if plan.execute {
            conn.last_cmd.set_awaiting_data(awaits_data(&conn.rbuf[conn.rstart..conn.rend]));
        }
        // charge
        conn.gate.charge(shaper, read.bytes, batch.requests, batch.reply_bytes);
        // flush
        match conn.flush(stats, env.settings) {
            Ok(true) => conn.gate.flushed(shaper),
            Ok(false) => {
                conn.blocked_on_write = true;
                return match registry.reregister(&mut conn.stream, Token(idx), Interest::WRITABLE) {
                    Ok(()) => After::Keep,
                    Err(_) => After::Close,
                };
            }
            Err(_) => return After::Close,
        }
        if let Some(id) = conn.state.watcher {
            // Its replies are out; what it sent after `watch` is ignored, as memcached does.
            return After::Watch(id);
        }
        if conn.close_after_flush {
            return After::Close;
        }
        if read.eof {
            // The client closed its side: memcached's end-of-stream close.
            conn.close_reason = CloseReason::Normal;
            return After::Close;
        }
        if yields_now(conn, &batch, stats, env.settings) {
            return After::Keep;
        }
        if plan.wait_ns > 0 {
            conn.gate.hold(since_start_ns(), plan.wait_ns);
            return After::Keep;
        }
        if conn.repl.parked || (!read.more && !batch.high && !batch.limited) {
            conn.gate.caught_up();
            return After::Keep;
        }
        want_read = read.more;
    }
    conn.needs_revisit = true;
    After::Keep
}

/// The execute step: run complete requests from the read buffer, appending replies, up to
/// `limits` (requests, reply bytes) when the tenant is shaped.
fn execute_batch(
    conn: &mut Conn,
    tenant: &Tenant,
    idx: usize,
    stats: &ThreadStats,
    env: &Env<'_>,
    limits: Option<(u32, u64)>,
) -> BatchEnd {
    let (requests_max, reply_bytes_max) = limits.unwrap_or((u32::MAX, u64::MAX));
    let start_len = conn.wbuf.len();
    // Values sent by reference are reply bytes too (the shaper counts them); the queue only
    // grows while the batch runs.
    let start_pinned = conn.state.shared.pinned_bytes();
    let mut end = BatchEnd::default();
    loop {
        if conn.wbuf.len() - conn.wstart >= WRITE_BUF_BYTES_HIGH
            || !conn.state.shared.has_room(SHARE_VALUE_BYTES_MIN)
            || !env.settings.conn_buf.charge_reply(&mut conn.state.reply_charged_bytes, conn.wbuf.capacity())
        {
            // Too much waiting for the socket, or replies that grew the buffer (a get charges
            // before it copies; other replies are small) and the budget cannot cover them:
            // execute nothing more until the client reads.
            end.high = true;
            break;
        }
        if conn.state.dump.is_some() {
            // A metadump in progress goes on before any later request, one bounded step at a
            // time while little waits for the socket; the round comes back for the rest.
            if conn.wbuf.len() - conn.wstart < DUMP_PENDING_BYTES_MAX {
                let mut ctx = Ctx {
                    store: &tenant.store,
                    stats,
                    settings: env.settings,
                    server: &tenant.info,
                    conn: &mut conn.state,
                };
                memcache_admin::dump_more(&mut ctx, &mut conn.wbuf);
            }
            if conn.state.dump.is_some() {
                end.high = true;
                break;
            }
            continue;
        }
        let input = &conn.rbuf[conn.rstart..conn.rend];
        if input.is_empty() || conn.state.watcher.is_some() {
            break;
        }
        let reply_bytes =
            conn.wbuf.len().saturating_sub(start_len) + conn.state.shared.pinned_bytes().saturating_sub(start_pinned);
        if end.requests >= requests_max || reply_bytes as u64 >= reply_bytes_max {
            end.limited = true;
            break;
        }
        if let Some(rep) = tenant.replica.get() {
            match replicated_turn(conn, tenant, rep, idx, env) {
                Turn::Execute => {}
                Turn::Proposed => {
                    end.requests += 1;
                    continue;
                }
                Turn::Parked => {
                    end.requests += 1;
                    break;
                }
                Turn::Wait => break,
            }
        }
        let input = &conn.rbuf[conn.rstart..conn.rend];
        let mut ctx =
            Ctx { store: &tenant.store, stats, settings: env.settings, server: &tenant.info, conn: &mut conn.state };
        // [sec hook] A server with -Y/-S: the auth executor decides (see crate::auth).
        let step = match env.settings.auth.as_deref() {
            Some(auth) => execute_authenticating(auth, &mut ctx, input, &mut conn.wbuf),
            None => execute_one(&mut ctx, input, &mut conn.wbuf),
        };
        match step {
            Step::Consumed(n) => {
                conn.rstart += n;
                conn.repl.covered_bytes = conn.repl.covered_bytes.saturating_sub(n);
                conn.needs_grow = false;
                end.requests += 1;
            }
            Step::Incomplete => {
                if incomplete(conn, tenant, stats, env) {
                    continue;
                }
                break;
            }
            Step::Close => {
                conn.close_after_flush = true;
                break;
            }
            Step::Quit => {
                conn.close_after_flush = true;
                conn.close_reason = CloseReason::Normal;
                break;
            }
            Step::Shutdown => {
                env.stop.stop();
                conn.close_after_flush = true;
                conn.close_reason = CloseReason::Shutdown;
                break;
            }
        }
    }
    end.reply_bytes = (conn.wbuf.len().saturating_sub(start_len)
        + conn.state.shared.pinned_bytes().saturating_sub(start_pinned)) as u64;
    conn.settle_read_buf(&env.settings.conn_buf);
    end
}

/// What a replicated tenant's connection does with the request at the front of its input.
enum Turn {
    /// Run it here (not a store access, a covered or local read, bad or partial input).
    Execute,
    /// Proposed (or answered `busy` in its place): the batch goes on with the next request.
    Proposed,
    /// Proposed alone, or a read barrier asked: the connection waits for the outcome.
    Parked,
    /// It must wait for the requests in flight: nothing more runs now.
    Wait,
}

/// The replication step before executing (see `crate::replicated`): a mutation is proposed
/// whole and the batch goes on (writes pipeline, up to `CONN_INFLIGHT_MAX`); anything else
/// waits until the writes in flight have answered, so replies keep request order and a read
/// sees the connection's own writes; an uncovered read asks for a barrier and parks.
fn replicated_turn(conn: &mut Conn, tenant: &Tenant, rep: &Arc<Replica>, idx: usize, env: &Env<'_>) -> Turn {
    if conn.repl.parked {
        return Turn::Wait;
    }
    let input = &conn.rbuf[conn.rstart..conn.rend];
    let route = replicated::route(&tenant.store, env.settings, &conn.state, input);
    let idle = conn.repl.inflight.is_empty();
    let (consumed, write, alone) = match route {
        Route::Local if idle => return Turn::Execute,
        Route::Read(_) if idle && (rep.local_reads || conn.repl.covered_bytes > 0) => return Turn::Execute,
        Route::Read(n) if idle => (n, false, false),
        Route::Write(n) => (n, true, false),
        Route::WriteAlone(n) => (n, true, true),
        Route::Local | Route::Read(_) => {
            conn.repl.parked = true;
            return Turn::Wait;
        }
    };
    let behind_alone = conn.repl.inflight.back().is_some_and(|f| f.alone);
    if behind_alone || conn.repl.inflight.len() >= replicated::CONN_INFLIGHT_MAX {
        conn.repl.parked = true;
        return Turn::Wait;
    }
    let protocol = replicated::protocol_of(&conn.state, input);
    if conn.state.protocol == Protocol::Undecided {
        conn.state.protocol = if protocol == replicated::PROTOCOL_BINARY { Protocol::Binary } else { Protocol::Text };
    }
    if conn.repl.serial == 0 {
        conn.repl.serial = replicated::next_serial();
    }
    let seq = conn.repl.next_seq;
    conn.repl.next_seq += 1;
    let (inbox, serial) = (env.inbox.clone(), conn.repl.serial);
    let done = move |outcome| inbox.deliver(Delivery { idx, serial, seq, outcome });
    let head = input[..consumed.min(HEAD_BYTES_MAX)].to_vec();
    let mut f = InFlight { seq, protocol, head, read_bytes: 0, alone, outcome: None };
    let sent = if write {
        let request = input[..consumed].to_vec();
        conn.rstart += consumed;
        conn.repl.covered_bytes = conn.repl.covered_bytes.saturating_sub(consumed);
        rep.propose(protocol, request, done)
    } else {
        // The read stays in the input: it runs when the barrier holds.
        f.read_bytes = consumed;
        rep.read_barrier(done)
    };
    if !sent {
        rep.failures.fetch_add(1, Ordering::Relaxed);
        if !write {
            conn.rstart += consumed;
            f.read_bytes = 0;
        }
        f.outcome = Some(Outcome::Failed(Fail::Busy));
    }
    conn.repl.inflight.push_back(f);
    if !sent {
        drain_answered(conn, Some(rep));
        return Turn::Proposed;
    }
    if alone || !write {
        conn.repl.parked = true;
        return Turn::Parked;
    }
    Turn::Proposed
}

/// Outcome `seq` arrived for the connection: the replies of its requests in flight that are
/// answered, oldest first up to the first still open, join the others in order. True if any
/// left the queue (the connection may go on with its input).
pub(super) fn resume(conn: &mut Conn, rep: Option<&Arc<Replica>>, seq: u64, outcome: Outcome) -> bool {
    let Some(f) = conn.repl.inflight.iter_mut().find(|f| f.seq == seq) else { return false };
    f.outcome = Some(outcome);
    drain_answered(conn, rep)
}

fn drain_answered(conn: &mut Conn, rep: Option<&Arc<Replica>>) -> bool {
    let mut any = false;
    while conn.repl.inflight.front().is_some_and(|f| f.outcome.is_some()) {
        let Some(f) = conn.repl.inflight.pop_front() else { break };
        any = true;
        match f.outcome {
            Some(Outcome::Reply(o)) => {
                conn.wbuf.extend_from_slice(&o.reply);
                if o.swallow_bytes > 0 {
                    conn.state.swallow_bytes = usize::try_from(o.swallow_bytes).unwrap_or(usize::MAX);
                }
            }
            Some(Outcome::ReadReady) => conn.repl.covered_bytes = conn.rend - conn.rstart,
            Some(Outcome::Failed(fail)) => {
                if let Some(r) = rep {
                    r.failures.fetch_add(1, Ordering::Relaxed);
                }
                if f.read_bytes > 0 {
                    // The read the barrier was for is answered with the error and dropped.
                    conn.rstart = (conn.rstart + f.read_bytes).min(conn.rend);
                    conn.repl.covered_bytes = 0;
                }
                replicated::compose_fail(&mut conn.wbuf, f.protocol, &f.head, fail);
            }
            None => {}
        }
    }
    if any {
        conn.repl.parked = false;
    }
    any
}

/// The request at the front of the buffer is incomplete. A full buffer may grow for it next
/// read; if the budget refused to grow it, the request is refused (true: the batch goes on
/// after it); one larger than the connection will ever buffer closes the connection.
fn incomplete(conn: &mut Conn, tenant: &Tenant, stats: &ThreadStats, env: &Env<'_>) -> bool {
    let full = conn.rstart == 0 && conn.rend == conn.rbuf.len();
    conn.needs_grow = full;
    if full && std::mem::take(&mut conn.grow_refused) {
        conn.needs_grow = false;
        // The budget would not let the buffer grow for this request.
        let input = &conn.rbuf[conn.rstart..conn.rend];
        let mut ctx =
            Ctx { store: &tenant.store, stats, settings: env.settings, server: &tenant.info, conn: &mut conn.state };
        let refused = memcache_text::refuse_unbufferable(&mut ctx, input, &mut conn.wbuf);
        ctx.conn.shared.discard_after(conn.wbuf.len());
        match refused {
            Step::Consumed(n) if n <= input.len() => {
                conn.rstart += n;
                return true;
            }
            _ => conn.close_after_flush = true,
        }
    } else if full && conn.rbuf.len() >= env.read_buf_bytes_max && !conn.long_get_line() {
        // A single request larger than we will ever buffer.
        conn.close_after_flush = true;
    }
    false
}

/// memcached `-R`: the most requests one connection runs per event, when it was given.
fn per_event_limit(settings: &Settings) -> Option<u32> {
    let t = &settings.tunables;
    t.reqs_per_event_set.then_some(t.reqs_per_event.max(1))
}

/// memcached `-R`: a connection that used up its requests for this event with input left
/// yields to the others (`conn_yields`) and is served again after this poll.
fn yields_now(conn: &mut Conn, batch: &BatchEnd, stats: &ThreadStats, settings: &Settings) -> bool {
    let t = &settings.tunables;
    if !t.reqs_per_event_set || !batch.limited || batch.requests < t.reqs_per_event {
        return false;
    }
    ThreadStats::incr(&stats.conn_yields);
    conn.needs_revisit = true;
    true
}
