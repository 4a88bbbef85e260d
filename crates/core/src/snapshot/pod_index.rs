//! The snapshot's index from pod key to id. It holds ids only, hashed by their pod's key and
//! compared through `key_of` (the snapshot's slots): a snapshot is copied every admission pass, and a map
//! holding 10,000 keys copied 20,000 strings each time. Every indexed id has its slot filled
//! (a growing table hashes its ids again through their keys).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::ids::PodId;
use crate::model::PodKey;

#[derive(Clone, Debug, Default)]
pub(super) struct PodIndex {
    ids: HashTable<PodId>,
    hasher: foldhash::fast::RandomState,
}

impl PodIndex {
    pub fn hash(&self, key: &PodKey) -> u64 {
        self.hasher.hash_one(key)
    }

    pub fn get<'k>(
        &self,
        key_of: impl Fn(PodId) -> Option<&'k PodKey>,
        key: &PodKey,
    ) -> Option<PodId> {
        self.find(key_of, self.hash(key), key)
    }

    /// The id indexed under `key`, whose hash is `hash`.
    pub fn find<'k>(
        &self,
        key_of: impl Fn(PodId) -> Option<&'k PodKey>,
        hash: u64,
        key: &PodKey,
    ) -> Option<PodId> {
        self.ids.find(hash, |id| key_of(*id) == Some(key)).copied()
    }

    /// Indexes `id` under its key, whose hash is `hash`; the caller found no other pod
    /// indexed under it.
    pub fn insert_unique<'k>(
        &mut self,
        key_of: impl Fn(PodId) -> Option<&'k PodKey>,
        hash: u64,
        id: PodId,
    ) {
        let hasher = &self.hasher;
        self.ids.insert_unique(hash, id, |other| {
            key_of(*other).map_or(0, |key| hasher.hash_one(key))
        });
    }

    /// Forgets `id`, indexed under `key` (its slot may be emptied already).
    pub fn remove(&mut self, key: &PodKey, id: PodId) {
        let hash = self.hash(key);
        if let Ok(entry) = self.ids.find_entry(hash, |other| *other == id) {
            entry.remove();
        }
    }
}
