//! Open-addressing hash index for one shard: maps a 32-bit hash tag to an entry slot number.
//!
//! Not for: storing keys. Each slot is one u64 (`tag << 32 | slot + 1`, 0 = empty); the caller
//! confirms a tag hit by comparing the key stored in the entry. Linear probing with
//! backward-shift deletion keeps probe chains short without tombstones.

/// Grow when the table would be more than 3/4 full.
const LOAD_NUM: usize = 3;
const LOAD_DEN: usize = 4;
const INITIAL_SLOTS: usize = 64;

pub(crate) struct Index {
    slots: Vec<u64>,
    mask: usize,
    len: usize,
}

#[inline(always)]
fn pack(tag: u32, idx: u32) -> u64 {
    ((tag as u64) << 32) | (idx as u64 + 1)
}

#[inline(always)]
fn tag_of(slot: u64) -> u32 {
    (slot >> 32) as u32
}

#[inline(always)]
fn idx_of(slot: u64) -> u32 {
    (slot as u32).wrapping_sub(1)
}

impl Index {
    pub(crate) fn new() -> Index {
        Index { slots: vec![0; INITIAL_SLOTS], mask: INITIAL_SLOTS - 1, len: 0 }
    }

    /// Bytes of the slot table (it grows, never shrinks).
    pub(crate) fn table_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u64>()
    }

    /// Find the entry whose tag matches and for which `is_key(idx)` holds.
    #[inline]
    pub(crate) fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let mut pos = tag as usize & self.mask;
        loop {
            let s = self.slots[pos];
            if s == 0 {
                return None;
            }
            if tag_of(s) == tag && is_key(idx_of(s)) {
                return Some(idx_of(s));
            }
            pos = (pos + 1) & self.mask;
        }
    }

    /// Insert a mapping; the caller guarantees the key is not present.
    pub(crate) fn insert(&mut self, tag: u32, idx: u32) {
        if (self.len + 1) * LOAD_DEN > self.slots.len() * LOAD_NUM {
            self.grow();
        }
        self.place(pack(tag, idx));
        self.len += 1;
    }

    fn place(&mut self, slot: u64) {
        let mut pos = tag_of(slot) as usize & self.mask;
        while self.slots[pos] != 0 {
            pos = (pos + 1) & self.mask;
        }
        self.slots[pos] = slot;
    }

    fn grow(&mut self) {
        let new_len = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![0; new_len]);
        self.mask = new_len - 1;
        for s in old.into_iter().filter(|&s| s != 0) {
            self.place(s);
        }
    }

    /// Remove the mapping `tag -> idx`; returns false if it was not there.
    pub(crate) fn remove(&mut self, tag: u32, idx: u32) -> bool {
        let want = pack(tag, idx);
        let mut pos = tag as usize & self.mask;
        loop {
            let s = self.slots[pos];
            if s == 0 {
                return false;
            }
            if s == want {
                break;
            }
            pos = (pos + 1) & self.mask;
        }
        // Backward-shift: pull later members of the cluster into the hole when their home
        // position allows it, so lookups never need tombstones.
        let mut hole = pos;
        let mut next = (pos + 1) & self.mask;
        loop {
            let s = self.slots[next];
            if s == 0 {
                break;
            }
            let home = tag_of(s) as usize & self.mask;
            if (next.wrapping_sub(home) & self.mask) >= (next.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = s;
                hole = next;
            }
            next = (next + 1) & self.mask;
        }
        self.slots[hole] = 0;
        self.len -= 1;
        true
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::Index;
    use std::collections::HashMap;

    #[test]
    fn random_insert_remove_matches_hashmap() {
        let seed = 0x1234_5678_9abc_def0u64;
        println!("index test seed {seed:#x}");
        let mut rng = seed;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut ix = Index::new();
        let mut model: HashMap<u32, u32> = HashMap::new(); // idx -> tag
        for step in 0..50_000u32 {
            let r = next();
            if r % 3 != 0 || model.is_empty() {
                // Few distinct tags on purpose: forces long shared clusters.
                let tag = (r >> 8) as u32 % 4096;
                let idx = step;
                ix.insert(tag, idx);
                model.insert(idx, tag);
            } else {
                let pick = *model.keys().nth((r >> 20) as usize % model.len().min(8)).unwrap();
                let tag = model.remove(&pick).unwrap();
                assert!(ix.remove(tag, pick));
            }
        }
        assert_eq!(ix.len(), model.len());
        for (&idx, &tag) in &model {
            assert_eq!(ix.find(tag, |i| i == idx), Some(idx));
        }
    }
}
