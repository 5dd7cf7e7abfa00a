//! memcached's key-dump and LRU crawler commands over the text protocol: `lru_crawler metadump`,
//! `lru_crawler crawl` and `stats cachedump`, with memcached 1.6.18's exact lines.
//!
//! Slipstream has one item class, reported as memcached's class 1 (as `stats items` does), so a
//! class list naming 1, `all` or `hash` dumps every live item, and any other valid class is
//! empty. Dumps are bounded (`DUMP_BYTES_MAX`) like memcached's crawler buffer.
//!
//! Not for: parsing (slipstream-proto) or the store walk itself (`Store::dump`).

use crate::exec::Ctx;
use slipstream_store::ItemMeta;

/// Largest metadump reply built at once. memcached streams its dump from a side thread; here
/// the reply is built in one go, so it is capped: a larger store's dump ends early with END
/// (tools page through keys with `stats cachedump`/`mg` anyway).
pub const DUMP_BYTES_MAX: usize = 64 * 1024 * 1024;
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

/// memcached's uriencode: RFC 3986 unreserved bytes as they are, the rest as `%XX`.
fn uriencode(key: &[u8], out: &mut Vec<u8>) {
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
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
        // Expired items are reclaimed when met (at the LRU tail or on access); there is no
        // background crawl to start, and memcached answers OK once one is scheduled.
        out.extend_from_slice(b"OK\r\n");
        return;
    }
    if class_one {
        let start = out.len();
        ctx.store.dump(0, |m| {
            if out.len() - start < DUMP_BYTES_MAX {
                metadump_line(&m, out);
            }
        });
    }
    out.extend_from_slice(b"END\r\n");
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
