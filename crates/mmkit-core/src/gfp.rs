//! Allocation flags (`Gfp`), migratetypes, and the allocation context computed once
//! per request (Linux's `alloc_context` and `alloc_flags`).
//!
//! `Gfp` says what the caller allows (reclaim, dipping into reserves, zeroing) and
//! what the page will be used for (movable, reclaimable, unmovable); from it the
//! allocator derives, once, the migratetype and the `ALLOC_*` flags that the fast and
//! slow paths use, so no path re-derives them.

use core::ops::{BitOr, BitOrAssign};

/// Get-free-pages flags.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Gfp(u32);

const GFP_MOVABLE_BIT: u32 = 1 << 0;
const GFP_RECLAIMABLE_BIT: u32 = 1 << 1;
const GFP_HIGH_BIT: u32 = 1 << 2;
const GFP_DIRECT_RECLAIM_BIT: u32 = 1 << 3;
const GFP_KSWAPD_RECLAIM_BIT: u32 = 1 << 4;
const GFP_ZERO_BIT: u32 = 1 << 5;
const GFP_NOWARN_BIT: u32 = 1 << 6;
const GFP_THISNODE_BIT: u32 = 1 << 7;

impl Gfp {
    /// Unmovable kernel allocation that may reclaim; never below the min watermark.
    pub const KERNEL: Gfp = Gfp(GFP_DIRECT_RECLAIM_BIT | GFP_KSWAPD_RECLAIM_BIT);
    /// Movable (user) allocation that may reclaim (Linux's GFP_HIGHUSER_MOVABLE).
    pub const MOVABLE: Gfp = Gfp(GFP_MOVABLE_BIT | GFP_DIRECT_RECLAIM_BIT | GFP_KSWAPD_RECLAIM_BIT);
    /// Reclaimable (cache-like) kernel allocation.
    pub const RECLAIMABLE: Gfp =
        Gfp(GFP_RECLAIMABLE_BIT | GFP_DIRECT_RECLAIM_BIT | GFP_KSWAPD_RECLAIM_BIT);
    /// Cannot sleep or reclaim; may dip below the min watermark by a bounded amount.
    pub const ATOMIC: Gfp = Gfp(GFP_HIGH_BIT | GFP_KSWAPD_RECLAIM_BIT);
    /// Cannot reclaim directly, no access to reserves.
    pub const NOWAIT: Gfp = Gfp(GFP_KSWAPD_RECLAIM_BIT);
    /// Movable, but never reclaims directly: an opportunistic user page (swap
    /// readahead) that is better not had than paid for with reclaim.
    pub const MOVABLE_NOWAIT: Gfp = Gfp(GFP_MOVABLE_BIT | GFP_KSWAPD_RECLAIM_BIT);
    /// Return zeroed memory.
    pub const ZERO: Gfp = Gfp(GFP_ZERO_BIT);
    /// Do not report a failure.
    pub const NOWARN: Gfp = Gfp(GFP_NOWARN_BIT);
    /// Allowed to dip into the min watermark reserve (`__GFP_HIGH`).
    pub const HIGH: Gfp = Gfp(GFP_HIGH_BIT);
    /// Only from the preferred node, no fallback along its zonelist
    /// (`__GFP_THISNODE`).
    pub const THISNODE: Gfp = Gfp(GFP_THISNODE_BIT);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// True when every bit of `other` is set.
    pub const fn contains(self, other: Gfp) -> bool {
        self.0 & other.0 == other.0
    }
    /// The migratetype an allocation with these flags comes from.
    #[inline]
    pub const fn migratetype(self) -> MigrateType {
        if self.0 & GFP_MOVABLE_BIT != 0 {
            MigrateType::Movable
        } else if self.0 & GFP_RECLAIMABLE_BIT != 0 {
            MigrateType::Reclaimable
        } else {
            MigrateType::Unmovable
        }
    }
    /// May the allocation run direct reclaim and compaction?
    #[inline]
    pub const fn can_direct_reclaim(self) -> bool {
        self.0 & GFP_DIRECT_RECLAIM_BIT != 0
    }
    /// May the allocation wake the background threads (kswapd, kcompactd)?
    #[inline]
    pub const fn can_wake_kswapd(self) -> bool {
        self.0 & GFP_KSWAPD_RECLAIM_BIT != 0
    }
    /// Only the preferred node (`__GFP_THISNODE`)?
    #[inline]
    pub const fn thisnode(self) -> bool {
        self.0 & GFP_THISNODE_BIT != 0
    }
}

impl BitOr for Gfp {
    type Output = Gfp;
    fn bitor(self, rhs: Gfp) -> Gfp {
        Gfp(self.0 | rhs.0)
    }
}

impl BitOrAssign for Gfp {
    fn bitor_assign(&mut self, rhs: Gfp) {
        self.0 |= rhs.0
    }
}

/// Migratetypes, grouped per pageblock for anti-fragmentation.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum MigrateType {
    /// Kernel data that cannot move (page tables, ...).
    Unmovable = 0,
    /// User pages that can be migrated through the reverse map.
    Movable = 1,
    /// Caches that can be freed by reclaim.
    Reclaimable = 2,
    /// Pageblocks reserved for high-order atomic allocations.
    HighAtomic = 3,
}

/// Number of migratetypes with free lists.
pub const MIGRATE_TYPES: usize = 4;
/// Migratetypes with per-CPU lists (Linux's MIGRATE_PCPTYPES).
pub const MIGRATE_PCPTYPES: usize = 3;

impl MigrateType {
    /// All migratetypes in index order.
    pub const ALL: [MigrateType; MIGRATE_TYPES] = [
        MigrateType::Unmovable,
        MigrateType::Movable,
        MigrateType::Reclaimable,
        MigrateType::HighAtomic,
    ];
    /// The name used in `/proc/pagetypeinfo`.
    pub const fn name(self) -> &'static str {
        match self {
            MigrateType::Unmovable => "Unmovable",
            MigrateType::Movable => "Movable",
            MigrateType::Reclaimable => "Reclaimable",
            MigrateType::HighAtomic => "HighAtomic",
        }
    }
    /// From an index 0..MIGRATE_TYPES.
    pub const fn from_index(i: usize) -> MigrateType {
        match i {
            0 => MigrateType::Unmovable,
            1 => MigrateType::Movable,
            2 => MigrateType::Reclaimable,
            _ => MigrateType::HighAtomic,
        }
    }
}

/// Fallback order when a migratetype's lists are empty (Linux's `fallbacks[]`).
pub(crate) const FALLBACKS: [[usize; 2]; MIGRATE_PCPTYPES] = [
    [
        MigrateType::Reclaimable as usize,
        MigrateType::Movable as usize,
    ],
    [
        MigrateType::Reclaimable as usize,
        MigrateType::Unmovable as usize,
    ],
    [
        MigrateType::Unmovable as usize,
        MigrateType::Movable as usize,
    ],
];

/// Watermark index into a zone's watermarks; the low bits of `alloc_flags`.
pub(crate) const ALLOC_WMARK_MIN: u32 = 0;
pub(crate) const ALLOC_WMARK_LOW: u32 = 1;
pub(crate) const ALLOC_WMARK_HIGH: u32 = 2;
pub(crate) const ALLOC_WMARK_MASK: u32 = 3;
/// `__GFP_HIGH`: may use half of the min reserve.
pub(crate) const ALLOC_HIGH: u32 = 1 << 4;
/// Cannot block (atomic): may use a further quarter, and the high-atomic reserve.
pub(crate) const ALLOC_HARDER: u32 = 1 << 5;

/// What the allocator derives from a request, once (Linux's `alloc_context`).
#[derive(Copy, Clone, Debug)]
pub struct AllocContext {
    /// The caller's flags.
    pub gfp: Gfp,
    /// Migratetype index.
    pub mt: usize,
    /// `ALLOC_*` flags for the slow path (watermark bits are chosen per attempt).
    pub(crate) slow_flags: u32,
    /// The preferred node: its zonelist is walked (Linux's `preferred_zoneref`).
    pub(crate) nid: usize,
    /// The first node of that zonelist inside the nodemask: `numa_hit` is
    /// counted against it (Linux's `preferred_zoneref`).
    pub(crate) hit_nid: usize,
    /// The node of the allocating CPU or thread (`numa_local` / `numa_other`).
    pub(crate) local: usize,
    /// The nodes allowed, as `NodeMask` bits (all ones: no nodemask).
    pub(crate) nodemask: u64,
    /// The node was chosen by interleaving (`numa_interleave`).
    pub(crate) interleave: bool,
}

impl AllocContext {
    /// Computes the context of a request.
    #[inline]
    pub fn new(gfp: Gfp) -> Self {
        let mut slow_flags = ALLOC_WMARK_MIN;
        // Linux: __GFP_HIGH == ALLOC_HIGH; !__GFP_DIRECT_RECLAIM with __GFP_HIGH is "atomic"
        if gfp.0 & GFP_HIGH_BIT != 0 {
            slow_flags |= ALLOC_HIGH;
            if !gfp.can_direct_reclaim() {
                slow_flags |= ALLOC_HARDER;
            }
        }
        AllocContext {
            gfp,
            mt: gfp.migratetype() as usize,
            slow_flags,
            nid: 0,
            hit_nid: 0,
            local: 0,
            nodemask: !0,
            interleave: false,
        }
    }
}
