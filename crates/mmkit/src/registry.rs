//! The spaces of one [`Mm`], by id (Linux reaches an `mm_struct` from a page
//! through its anon_vma; mmkit's reverse map records a space id instead, and this
//! table turns the id back into the space).
//!
//! Ids are small integers from 1, unique among the live spaces of one Mm and
//! reused after a space is dropped; they fit the reverse map's encoding
//! (`rmap.rs`). Each Mm has its own registry, so page-side code (compaction,
//! migration, reclaim) only ever finds spaces whose pages come from the
//! same arena as the page it started from.
//!
//! Invariants: slot `id - 1` holds a weak reference to the space with that id
//! from `publish` until `release_id` (when the space's inner state is dropped,
//! or was never built); a free id is in `free` and its slot is `None`. The
//! references are weak: the registry never keeps a space alive, and a space
//! keeps its Mm alive, not the other way round.
//!
//! Locking: one mutex, a leaf lock: held only to reserve, publish, release or
//! resolve an id, never while any other lock is taken (see the lock order in
//! `rmap.rs`).

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::rmap::MAX_SPACE_ID;
use crate::space::{Space, SpaceInner};
use crate::Error;

#[derive(Default)]
struct Slots {
    slots: Vec<Option<Weak<SpaceInner>>>,
    free: Vec<u64>,
}

/// The live spaces of one Mm, by id.
#[derive(Default)]
pub(crate) struct SpaceRegistry {
    inner: Mutex<Slots>,
}

impl SpaceRegistry {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a space id (ids are reused after the space is dropped).
    pub(crate) fn reserve_id(&self) -> Result<u64, Error> {
        let mut r = self.lock();
        if let Some(id) = r.free.pop() {
            return Ok(id);
        }
        let id = r.slots.len() as u64 + 1;
        if id > MAX_SPACE_ID {
            return Err(Error::Config(format!(
                "too many address spaces alive (at most {MAX_SPACE_ID}); drop some first"
            )));
        }
        r.slots.push(None);
        Ok(id)
    }

    /// Publishes the space behind a reserved id.
    pub(crate) fn publish(&self, id: u64, space: &Arc<SpaceInner>) {
        self.lock().slots[id as usize - 1] = Some(Arc::downgrade(space));
    }

    /// Gives an id back (the space is being dropped, or was never built).
    pub(crate) fn release_id(&self, id: u64) {
        let mut r = self.lock();
        r.slots[id as usize - 1] = None;
        r.free.push(id);
    }

    /// Every live space (swapoff's walk).
    pub(crate) fn all(&self) -> Vec<Space> {
        let r = self.lock();
        r.slots
            .iter()
            .flatten()
            .filter_map(|w| w.upgrade().map(Space::from_inner))
            .collect()
    }

    /// The live space with this id (for the reverse-map walk, which starts from a
    /// page's `mapping` word).
    pub(crate) fn get(&self, id: u64) -> Option<Space> {
        let r = self.lock();
        let w = r.slots.get(id.checked_sub(1)? as usize)?.as_ref()?;
        w.upgrade().map(Space::from_inner)
    }
}
