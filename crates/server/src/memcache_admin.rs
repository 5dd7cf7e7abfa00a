//! memcached's key-dump and LRU crawler commands over the text protocol: `lru_crawler metadump`,
//! `lru_crawler crawl` and `stats cachedump`, with memcached 1.6.18's exact lines; and its
//! other side commands, `watch` and `refresh_certs`.
//!
//! Slipstream has one item class, reported as memcached's class 1 (as `stats items` does), so a
//! class list naming 1, `all` or `hash` dumps every live item, and any other valid class is
//! empty. A metadump is streamed in bounded steps as the client reads (`dump_more`, driven by
//! the TCP loop); a crawl runs on the crawler thread (`crawler`).
//!
//! Not for: parsing (slipstream-proto) or the store walk itself (`Store::dump_step`).

use crate::crawler::{CrawlStart, DumpCursor, CRAWLER};
use crate::exec::{Ctx, Transport};
use crate::watch::{uriencode, WatchRefused};
use slipstream_store::ItemMeta;

/// Slots of one shard a metadump step copies out under the shard's lock.
const DUMP_SLOTS_PER_STEP: usize = 256;
/// A TCP connection's metadump is produced while fewer unsent bytes than this wait in its
/// reply buffer, one step at a time; the rest waits until the client reads (see `net::tcp`),
/// so the dump of any store holds at most this plus one step per connection, charged to the
/// connection-buffer budget (`-o read_buf_mem_limit`) like any reply.
pub const DUMP_PENDING_BYTES_MAX: usize = 64 * 1024;
/// A UDP reply is built at once (there is no reading client to wait for): capped.
const DUMP_UDP_BYTES_MAX: usize = 1024 * 1024;
/// memcached's cachedump buffer: 2 MB.
const CACHEDUMP_BYTES_MAX: usize = 2 * 1024 * 1024;
/// memcached's slab class ids: 1..64.
const CLASS_MAX: u32 = 63;

/// Which classes a `lru_crawler` argument names; None = `BADCLASS`.
fn names_class_one(classes: &[u8]) -> Option<bool> {
    match classes {
        b"all" | b"hash" => Some(true),
        list => {
            let mut one = false;
            for p in list.split(|&b| b == b',').filter(|p| !p.is_empty()) {
                let id = slipstream_proto::rules::safe_strtoul(p)?;
                if id == 0 || id > CLASS_MAX {
                    return None;
                }
                one |= id == 1;
            }
            Some(one)
        }
    }
}

fn metadump_line(m: &ItemMeta, out: &mut Vec<u8>) {
    out.extend_from_slice(b"key=");
    uriencode(&m.key, out);
    let line = format!(
        " exp={} la={} cas={} fetch={} cls=1 size={}\n",
        m.exptime_unix_s.unwrap_or(-1),
        m.atime_unix_s,
        m.cas,
        if m.fetched { "yes" } else { "no" },
        m.item_bytes
    );
    out.extend_from_slice(line.as_bytes());
}

/// `lru_crawler metadump <classes>` / `lru_crawler crawl <classes>`.
pub fn lru_crawler(ctx: &mut Ctx<'_>, metadump: bool, classes: &[u8], out: &mut Vec<u8>) {
    let tu = &ctx.settings.tunables;
    if !tu.lru_crawler_on() {
        out.extend_from_slice(b"CLIENT_ERROR lru crawler disabled\r\n");
        return;
    }
    if metadump && !tu.dump_enabled {
        out.extend_from_slice(b"ERROR metadump not allowed\r\n");
        return;
    }
    if metadump && !out.is_empty() {
        out.extend_from_slice(b"ERROR cannot pipeline other commands before metadump\r\n");
        return;
    }
    let Some(class_one) = names_class_one(classes) else {
        out.extend_from_slice(b"BADCLASS invalid class id\r\n");
        return;
    };
    if !metadump {
        // Items live in class 1 only: other classes have nothing to walk (memcached answers
        // OK for an empty class too).
        let line: &[u8] = if !class_one {
            b"OK\r\n"
        } else {
            match CRAWLER.start(ctx.store.clone(), tu.lru_crawler_sleep_us, tu.lru_crawler_tocrawl) {
                CrawlStart::Started => b"OK\r\n",
                CrawlStart::Busy => b"BUSY currently processing crawler request\r\n",
                CrawlStart::Failed => b"ERROR an unknown error happened\r\n",
            }
        };
        out.extend_from_slice(line);
        return;
    }
    if !class_one {
        out.extend_from_slice(b"END\r\n");
        return;
    }
    ctx.conn.dump = Some(DumpCursor::default());
    if ctx.conn.transport == Transport::Udp {
        let start = out.len();
        while ctx.conn.dump.is_some() && out.len() - start < DUMP_UDP_BYTES_MAX {
            dump_more(ctx, out);
        }
        if ctx.conn.dump.take().is_some() {
            out.extend_from_slice(b"END\r\n");
        }
    }
    // TCP: the network loop calls `dump_more` as the client reads.
}

/// Append the next step of the connection's metadump to `out` (the live items among one
/// step's slots of one shard); the last step appends `END` and clears the cursor.
pub fn dump_more(ctx: &mut Ctx<'_>, out: &mut Vec<u8>) {
    let Some(mut c) = ctx.conn.dump else { return };
    let shards = ctx.store.shard_count();
    while c.shard < shards {
        match ctx.store.dump_step(c.shard, c.slot, DUMP_SLOTS_PER_STEP, |m| metadump_line(&m, out)) {
            Some(slot) => {
                c.slot = slot;
                ctx.conn.dump = Some(c);
                return;
            }
            None => {
                c.shard += 1;
                c.slot = 0;
            }
        }
    }
    ctx.conn.dump = None;
    out.extend_from_slice(b"END\r\n");
}

/// `refresh_certs` (memcached's process_refresh_certs_command): `OK` (silenced by `noreply`)
/// once the certificate files are loaded again, else memcached's error line, which `noreply`
/// does not silence (memcached writes it directly). Without `-Z`, memcached built with TLS
/// answers `Error TLS not enabled`.
pub fn refresh_certs(ctx: &mut Ctx<'_>, noreply: bool, out: &mut Vec<u8>) {
    let Some(tls) = ctx.settings.tls.as_deref() else {
        out.extend_from_slice(b"Error TLS not enabled\r\n");
        return;
    };
    match tls.refresh(ctx.server.uptime_s()) {
        Ok(()) if noreply => {}
        Ok(()) => out.extend_from_slice(b"OK\r\n"),
        Err(e) => out.extend_from_slice(format!("{e}\r\n").as_bytes()),
    }
}

/// `watch [classes]` (memcached's process_watch_command): the line to answer now. On success
/// that is nothing — memcached's `OK` is the first thing the watcher's stream sends — and the
/// connection is marked for the network loop to hand to the log writer. `pipelined`: replies
/// of earlier requests are still unsent.
pub fn watch(ctx: &mut Ctx<'_>, classes: Option<u16>, pipelined: bool) -> &'static [u8] {
    if !ctx.settings.tunables.watch_enabled {
        return b"CLIENT_ERROR watch commands not allowed\r\n";
    }
    if pipelined {
        return b"ERROR cannot pipeline other commands before watch\r\n";
    }
    let Some(classes) = classes else { return b"ERROR\r\n" };
    if ctx.conn.transport == Transport::Udp {
        // A UDP socket serves everyone: it cannot become one client's log stream.
        return b"WATCHER_FAILED failed to add log watcher\r\n";
    }
    match ctx.settings.logger.reserve(classes) {
        Ok(id) => {
            ctx.conn.watcher = Some(id);
            b""
        }
        Err(WatchRefused::TooMany) => b"WATCHER_TOO_MANY log watcher limit reached\r\n",
    }
}

/// `stats cachedump <class> <limit>` (the parser has checked both numbers).
pub fn cachedump(ctx: &mut Ctx<'_>, class: u32, limit: u32, out: &mut Vec<u8>) {
    if !ctx.settings.tunables.dump_enabled {
        out.extend_from_slice(b"CLIENT_ERROR stats cachedump not allowed\r\n");
        return;
    }
    if class == 1 {
        let start = out.len();
        ctx.store.dump(limit as usize, |m| {
            let line = format!(" [{} b; {} s]\r\n", m.value_bytes, m.exptime_unix_s.unwrap_or(0));
            // memcached's buffer: whole lines only, room left for END.
            if out.len() - start + m.key.len() + 5 + line.len() + 6 <= CACHEDUMP_BYTES_MAX {
                out.extend_from_slice(b"ITEM ");
                out.extend_from_slice(&m.key);
                out.extend_from_slice(line.as_bytes());
            }
        });
    }
    out.extend_from_slice(b"END\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uriencode_is_memcacheds() {
        let mut o = Vec::new();
        uriencode(b"a%20b/c-._~Z9 \x80", &mut o);
        assert_eq!(o, b"a%2520b%2Fc-._~Z9%20%80");
    }

    #[test]
    fn class_lists() {
        assert_eq!(names_class_one(b"all"), Some(true));
        assert_eq!(names_class_one(b"hash"), Some(true));
        assert_eq!(names_class_one(b"1,2,3"), Some(true));
        assert_eq!(names_class_one(b"2"), Some(false));
        assert_eq!(names_class_one(b"0"), None);
        assert_eq!(names_class_one(b"64"), None);
        assert_eq!(names_class_one(b"keys"), None);
    }
}
