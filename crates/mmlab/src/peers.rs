//! The variants a workload runs in (the tables' columns): mmkit built with each of
//! its policy presets, and the peers a user would pick instead of mmkit for
//! page-sized blocks (mimalloc, jemalloc, the `buddy_system_allocator` crate).
//!
//! Every variant is driven through the same three calls, `alloc`, `touch` and
//! `free`, so a workload's loop body is identical for all of them. A `Block` is
//! an opaque handle: a pfn for mmkit, a pointer for the mallocs, a frame number
//! for `buddy_system_allocator`. `touch` writes one byte per 4 KiB page.
//!
//! Dispatch is a `match` on a small enum (one predictable branch, the same cost
//! for every variant), so the loops stay monomorphic without generics in the
//! workloads.

use anyhow::{anyhow, bail, Context, Result};
use mmkit::{ClearStrategy, Gfp, LockStats, Mm, Pfn, Variant};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Size of one page in bytes (the unit every variant hands out).
pub const PAGE: usize = 4096;

/// Free-list count of the buddy_system_allocator peer: the crate's default (32).
/// Its buddy merges up to the largest block the buffer holds, further than
/// mmkit's order 10; a smaller count would cap that, but the crate (0.11) drops a
/// block that merges past its top list, so the default is the one that works.
const BUDDY_ORDERS: usize = 32;

/// A variant's name and what it is, for `mmlab list` and docs/lab.md.
pub struct VariantInfo {
    pub name: &'static str,
    pub description: &'static str,
}

/// Every variant, in the default column order (the first is the baseline that
/// the percentages are taken against).
pub const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description:
            "mmkit, default policies (PCP on, lazy merging, cluster refill, auto PCP high)",
    },
    VariantInfo {
        name: "mmkit-eager",
        description:
            "mmkit as Linux before the zone-lock work: PCP with fixed high, eager merging, \
                      page-by-page refill",
    },
    VariantInfo {
        name: "mmkit-nopcp",
        description:
            "mmkit without per-CPU page lists, eager merging: every alloc/free takes the zone lock",
    },
    VariantInfo {
        name: "mmkit-nomerge",
        description: "mmkit with lazy order-0 merging but no merge on demand (Linux's skip-merge \
                      patch alone): the old trade-off, next to the default",
    },
    VariantInfo {
        name: "mimalloc",
        description: "mimalloc: mi_malloc_aligned(4096 << order, 4096) / mi_free",
    },
    VariantInfo {
        name: "jemalloc",
        description: "jemalloc: mallocx(4096 << order, MALLOCX_ALIGN(4096)) / sdallocx",
    },
    VariantInfo {
        name: "buddy_system_allocator",
        description: "the buddy_system_allocator crate's FrameAllocator<32> behind a std Mutex, \
                      over a prefaulted buffer as large as mmkit's arena",
    },
];

/// Whether `name` is a known variant.
pub fn is_variant(name: &str) -> bool {
    VARIANTS.iter().any(|v| v.name == name)
}

/// An allocated block: a pfn (mmkit), an address (mallocs) or a frame number
/// (buddy_system_allocator). Plain data, so it can travel between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block(usize);

impl Block {
    /// A placeholder for unused slots of fixed-size arrays of blocks.
    pub const NULL: Block = Block(0);
}

/// mmkit with the counters the lab checks after a workload.
pub struct MmPeer {
    mm: Mm,
    /// Free pages right after the arena was built; equal again once a workload
    /// freed everything and the per-CPU lists were drained.
    initial_free: u64,
    /// `free_pages` calls that returned an error (a lab or library bug).
    free_errors: AtomicU64,
    /// A swap file of this mm's (`--swap file:PATH`), removed on drop.
    swap_file: Option<std::path::PathBuf>,
    /// A host object the mm uses (its NBD server), dropped after the mm.
    keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Drop for MmPeer {
    fn drop(&mut self) {
        if let Some(f) = &self.swap_file {
            // The Mm still has it open; its space goes when the Mm closes it.
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The `buddy_system_allocator` peer: frame numbers from a `FrameAllocator`,
/// backed by a real, prefaulted buffer so that `touch` writes real memory.
pub struct BuddyPeer {
    alloc: Mutex<buddy_system_allocator::FrameAllocator<BUDDY_ORDERS>>,
    /// First frame number handed to the allocator; frame `f` lives at
    /// `base + (f - first) * PAGE`. A power of two at least as large as the
    /// buffer, so the range starts aligned for blocks of every order.
    first: usize,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` points to a private anonymous mapping owned by this struct for its
// whole life; the struct hands out disjoint blocks of it (the frame allocator,
// behind its Mutex, never gives one frame to two holders), so sharing it between
// threads is as safe as sharing the mutex.
unsafe impl Send for BuddyPeer {}
// SAFETY: see `Send` above; all shared mutable state is behind `alloc`'s Mutex.
unsafe impl Sync for BuddyPeer {}

impl Drop for BuddyPeer {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` is exactly the mapping created in `BuddyPeer::new`,
        // and no block can outlive the peer (workers are joined before it drops).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

impl BuddyPeer {
    fn new(memory: usize) -> Result<BuddyPeer> {
        let frames = memory / PAGE;
        if frames == 0 {
            bail!("--memory {memory} is smaller than one page (the arena)");
        }
        let len = frames * PAGE;
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {len} bytes for buddy_system_allocator failed: {}; try a smaller --memory budget",
                std::io::Error::last_os_error()
            );
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| anyhow!("mmap returned null"))?;
        let first = frames.next_power_of_two();
        let mut fa = buddy_system_allocator::FrameAllocator::<BUDDY_ORDERS>::new();
        fa.add_frame(first, first + frames);
        Ok(BuddyPeer {
            alloc: Mutex::new(fa),
            first,
            base,
            len,
        })
    }

    #[inline]
    fn addr(&self, frame: usize) -> *mut u8 {
        debug_assert!(frame >= self.first && (frame - self.first) * PAGE < self.len);
        // The offset stays inside the mapping for every frame the allocator hands
        // out (frames first..first+frames), so this is plain address arithmetic.
        self.base.as_ptr().wrapping_add((frame - self.first) * PAGE)
    }

    /// Whether every frame is free again: true if the whole buffer can be taken
    /// as one block (checked only when the frame count is a power of two).
    fn all_free(&self) -> bool {
        let frames = self.len / PAGE;
        if !frames.is_power_of_two() {
            return true;
        }
        let mut fa = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        match fa.alloc(frames) {
            Some(f) => {
                fa.dealloc(f, frames);
                true
            }
            None => false,
        }
    }
}

/// One variant, ready to allocate.
pub enum Peer {
    Mmkit(MmPeer),
    Mimalloc,
    Jemalloc,
    Buddy(Box<BuddyPeer>),
    /// A variant of a workload with its own variants that is not an allocator of
    /// the lab's (the host kernel's own mmap and faults, a raw clearing loop): the
    /// workload runs its own loop, picked by this name. It allocates nothing
    /// (`alloc` gives `None`).
    Native(&'static str),
}

/// jemalloc flags for page alignment: MALLOCX_ALIGN(4096) = log2(4096) = 12.
const JE_FLAGS: libc::c_int = tikv_jemalloc_sys::MALLOCX_ALIGN(PAGE);

impl Peer {
    /// Builds variant `name` with `memory` bytes (mmkit's arena, the buddy peer's
    /// buffer; the mallocs take memory from the host as they need it).
    pub fn create(name: &str, memory: usize) -> Result<Peer> {
        if crate::settings::is_custom(name) {
            let s = crate::settings::Settings::parse(name).map_err(|e| anyhow!(e))?;
            return Peer::from_settings(&s, memory);
        }
        if let Some(v) = Variant::from_name(name) {
            let mm = Mm::builder()
                .memory(memory)
                .variant(v)
                .prefault(true)
                .build()
                .with_context(|| format!("building mmkit variant {name} with {memory} bytes"))?;
            return Ok(Peer::of_mm(mm));
        }
        match name {
            "mimalloc" => Ok(Peer::Mimalloc),
            "jemalloc" => Ok(Peer::Jemalloc),
            "buddy_system_allocator" => Ok(Peer::Buddy(Box::new(BuddyPeer::new(memory)?))),
            _ => bail!("unknown variant {name:?}; `mmlab list` shows the variants"),
        }
    }

    /// mmkit with policy preset `variant` and clearing strategy `clear` on a
    /// prefaulted arena of `memory` bytes, for the workloads with their own
    /// variants (which name it themselves, e.g. `mmkit-page-at-a-time`).
    pub fn create_mmkit(
        name: &str,
        variant: Variant,
        memory: usize,
        clear: ClearStrategy,
    ) -> Result<Peer> {
        let mm = Mm::builder()
            .memory(memory)
            .variant(variant)
            .clear(clear)
            .prefault(true)
            .build()
            .with_context(|| format!("building mmkit variant {name} with {memory} bytes"))?;
        Ok(Peer::of_mm(mm))
    }

    /// An mmkit peer over `mm`, its free count taken now.
    fn of_mm(mm: Mm) -> Peer {
        let initial_free = mm.nr_free_pages();
        Peer::Mmkit(MmPeer {
            mm,
            initial_free,
            free_errors: AtomicU64::new(0),
            swap_file: None,
            keep: None,
        })
    }

    /// A custom variant (`--set`): mmkit with `settings` on a prefaulted arena of
    /// `memory` bytes.
    pub fn from_settings(settings: &crate::settings::Settings, memory: usize) -> Result<Peer> {
        let name = settings.name();
        let mm = settings
            .apply(Mm::builder())
            .memory(memory)
            .prefault(true)
            .build()
            .with_context(|| format!("building custom variant {name} with {memory} bytes"))?;
        Ok(Peer::of_mm(mm))
    }

    /// Removes `file` when this mmkit peer is dropped (its swap file).
    pub fn remove_on_drop(&mut self, file: std::path::PathBuf) {
        if let Peer::Mmkit(p) = self {
            p.swap_file = Some(file);
        }
    }

    /// Keeps `obj` (what the mm's swap device is, with a server it talks to)
    /// until this mmkit peer is dropped, after its `Mm`.
    pub fn keep_alive(&mut self, obj: Box<dyn std::any::Any + Send + Sync>) {
        if let Peer::Mmkit(p) = self {
            p.keep = Some(obj);
        }
    }

    /// The object kept by `keep_alive`, if it is a `T`.
    pub fn kept<T: 'static>(&self) -> Option<&T> {
        match self {
            Peer::Mmkit(p) => p.keep.as_ref()?.downcast_ref(),
            _ => None,
        }
    }

    /// The `Mm` of an mmkit variant.
    pub fn mm(&self) -> Option<&Mm> {
        match self {
            Peer::Mmkit(p) => Some(&p.mm),
            _ => None,
        }
    }

    /// The name of a `Native` variant.
    pub fn native(&self) -> Option<&'static str> {
        match self {
            Peer::Native(n) => Some(n),
            _ => None,
        }
    }

    /// Allocates a block of `2^order` pages; `None` when out of memory.
    #[inline]
    pub fn alloc(&self, order: u32) -> Option<Block> {
        match self {
            Peer::Native(_) => None,
            Peer::Mmkit(p) => {
                p.mm.alloc_pages(Gfp::KERNEL, order)
                    .ok()
                    .map(|pfn| Block(pfn.get() as usize))
            }
            Peer::Mimalloc => {
                // SAFETY: mi_malloc_aligned has no preconditions; a null result
                // means out of memory and is mapped to None.
                let p = unsafe { libmimalloc_sys::mi_malloc_aligned(PAGE << order, PAGE) };
                (!p.is_null()).then_some(Block(p as usize))
            }
            Peer::Jemalloc => {
                // SAFETY: mallocx requires a non-zero size (PAGE << order is) and
                // valid flags (an alignment of 4096); null means out of memory.
                let p = unsafe { tikv_jemalloc_sys::mallocx(PAGE << order, JE_FLAGS) };
                (!p.is_null()).then_some(Block(p as usize))
            }
            Peer::Buddy(b) => b
                .alloc
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .alloc(1 << order)
                .map(Block),
        }
    }

    /// Frees a block.
    ///
    /// # Safety
    /// `block` was returned by `self.alloc(order)` (same order) and has not been
    /// freed since; for the mallocs a bad block is undefined behaviour (mmkit
    /// refuses it and counts the error).
    #[inline]
    pub unsafe fn free(&self, block: Block, order: u32) {
        match self {
            Peer::Mmkit(p) => {
                if p.mm.free_pages(Pfn::new(block.0 as u64), order).is_err() {
                    p.free_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            // SAFETY: the caller passes a live block from mi_malloc_aligned
            // (this function's contract).
            Peer::Mimalloc => unsafe { libmimalloc_sys::mi_free(block.0 as *mut _) },
            // SAFETY: the caller passes a live block from mallocx with this
            // order, so size and flags match (this function's contract).
            Peer::Jemalloc => unsafe {
                tikv_jemalloc_sys::sdallocx(block.0 as *mut _, PAGE << order, JE_FLAGS)
            },
            Peer::Buddy(b) => b
                .alloc
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dealloc(block.0, 1 << order),
            // `alloc` never hands out a block, so there is none to free.
            Peer::Native(_) => {}
        }
    }

    /// Writes one byte to every page of the block.
    ///
    /// # Safety
    /// `block` was returned by `self.alloc(order)` (same order) and has not been
    /// freed since, so its 2^order pages are writable and the caller's.
    #[inline]
    pub unsafe fn touch(&self, block: Block, order: u32) {
        let p = match self {
            Peer::Mmkit(p) => p.mm.page_address(Pfn::new(block.0 as u64)),
            Peer::Mimalloc | Peer::Jemalloc => block.0 as *mut u8,
            Peer::Buddy(b) => b.addr(block.0),
            // `alloc` never hands out a block, so there is nothing to touch.
            Peer::Native(_) => return,
        };
        for i in 0..(1usize << order) {
            // SAFETY: by this function's contract `p` starts a live block of
            // 2^order writable pages owned by the caller (mmkit's page_address,
            // the malloc result, or the buddy buffer), so p + i*PAGE is inside
            // it. Volatile so that the write is not optimized away before the free.
            unsafe { p.add(i * PAGE).write_volatile(i as u8) };
        }
    }

    /// The zone lock counters, for mmkit variants.
    pub fn lock_stats(&self) -> Option<LockStats> {
        match self {
            Peer::Mmkit(p) => Some(p.mm.zone_lock_stats()),
            _ => None,
        }
    }

    /// Brings the variant back to a comparable state between points (mmkit:
    /// drains the per-CPU lists, so each point starts from the buddy lists).
    pub fn settle(&self) {
        if let Peer::Mmkit(p) = self {
            p.mm.drain_all_pages();
        }
    }

    /// After a workload: every block must be back. For mmkit this runs the
    /// invariant walk and compares the free count with the one at build time.
    pub fn check(&self) -> Result<()> {
        if let Peer::Mmkit(p) = self {
            let errs = p.free_errors.load(Ordering::Relaxed);
            if errs != 0 {
                bail!("{errs} free_pages calls were refused");
            }
            // A background compaction run holds isolated pages until it ends.
            p.mm.wait_compaction_idle();
            p.mm.wait_reclaim_idle();
            p.mm.drain_all_pages();
            p.mm.check().context("mm.check() after the workload")?;
            let free = p.mm.nr_free_pages();
            if free != p.initial_free {
                bail!(
                    "nr_free_pages is {free} after the workload, {} before: pages leaked",
                    p.initial_free
                );
            }
        }
        if let Peer::Buddy(b) = self {
            if !b.all_free() {
                bail!("buddy_system_allocator: frames leaked (the buffer is not one free block)");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(peer: &Peer) {
        let mut held = Vec::new();
        for order in 0..=3 {
            let b = peer.alloc(order).expect("alloc");
            // SAFETY: b was just allocated with this order.
            unsafe { peer.touch(b, order) };
            held.push((b, order));
        }
        for (b, order) in held {
            // SAFETY: each block is freed once, with its order.
            unsafe { peer.free(b, order) };
        }
        peer.check().unwrap();
    }

    #[test]
    fn peers_allocate_touch_and_free() {
        roundtrip(&Peer::Mimalloc);
        roundtrip(&Peer::Jemalloc);
        roundtrip(&Peer::create("buddy_system_allocator", 4 << 20).unwrap());
        for v in ["mmkit", "mmkit-eager", "mmkit-nopcp"] {
            let peer = Peer::create(v, 16 << 20).unwrap();
            assert!(peer.lock_stats().is_some());
            roundtrip(&peer);
        }
    }

    #[test]
    fn buddy_peer_runs_out_and_recovers() {
        let peer = Peer::create("buddy_system_allocator", 16 * PAGE).unwrap();
        let blocks: Vec<_> = std::iter::from_fn(|| peer.alloc(0)).take(100).collect();
        assert_eq!(blocks.len(), 16);
        for b in blocks {
            // SAFETY: each block is freed once, with its order.
            unsafe { peer.free(b, 0) };
        }
        assert!(peer.alloc(4).is_some());
        let big = Peer::create("buddy_system_allocator", 8 << 20).unwrap();
        let b = big.alloc(0).unwrap();
        assert!(big.check().is_err(), "a held frame is a leak");
        // SAFETY: b is live, order 0.
        unsafe { big.free(b, 0) };
        big.check().unwrap();
    }

    #[test]
    fn variant_names_are_known() {
        for v in VARIANTS {
            assert!(is_variant(v.name));
        }
        assert!(Peer::create("no-such-variant", 1 << 20).is_err());
    }
}
