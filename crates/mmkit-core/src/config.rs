//! The policies the lab compares, each a runtime value, so one binary runs them all.

/// Per-CPU page lists.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum PcpPolicy {
    /// Orders 0..=3 go through per-CPU lists.
    On,
    /// Every allocation and free takes the zone lock.
    Off,
}

/// Buddy merging on free.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum MergePolicy {
    /// Merge with free buddies on every free.
    Eager,
    /// Skip the merge for order-0 frees; merge on demand when a high-order request,
    /// a fallback or compaction needs it.
    Lazy,
    /// Skip the merge for order-0 frees and never merge on demand (Linux's first
    /// skip-merge patch alone): lazily freed pages merge only with blocks freed
    /// later next to them. Compaction still migrates, as for `Eager`, but has no
    /// merge step. Kept to show the trade-off merge on demand removes.
    LazyNoMerge,
}

impl MergePolicy {
    /// Do order-0 frees skip the merge?
    #[inline]
    pub const fn skips_merge(self) -> bool {
        !matches!(self, MergePolicy::Eager)
    }
    /// Are lazily freed pages merged on demand (high-order requests, fallbacks,
    /// cluster refills, the slow path, compaction)?
    #[inline]
    pub const fn merges_on_demand(self) -> bool {
        matches!(self, MergePolicy::Lazy)
    }
}

/// How per-CPU lists are refilled from and drained to the zone.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum RefillPolicy {
    /// One buddy allocation (split, descriptor writes) per page under the lock.
    PageByPage,
    /// Take a contiguous run from one block, touching only its head under the lock;
    /// free back aligned runs as whole blocks.
    Cluster,
}

/// How per-CPU `high` is chosen.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum PcpHighPolicy {
    /// A fixed `high` (6 * batch, as Linux before 6.7).
    Fixed,
    /// Auto-tuned between `high_min` and `high_max` (Linux 6.7).
    Auto,
}

/// Configuration of a page allocator.
#[derive(Clone, Debug)]
pub struct Config {
    /// Per-CPU lists on or off.
    pub pcp: PcpPolicy,
    /// Eager or lazy merging.
    pub merge: MergePolicy,
    /// Page-by-page or cluster refill.
    pub refill: RefillPolicy,
    /// Fixed or auto-tuned `high`.
    pub pcp_high: PcpHighPolicy,
    /// Number of per-CPU slots (CPU ids are reduced modulo this).
    pub nr_cpus: usize,
    /// Per-CPU batch; `None` derives it from the zone size as Linux does.
    pub pcp_batch: Option<u32>,
    /// Lock-free per-CPU order-0 caches in front of the per-CPU lists
    /// ([`crate::pcp_cache`]), where the platform has restartable sequences.
    pub pcp_cache: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pcp: PcpPolicy::On,
            merge: MergePolicy::Lazy,
            refill: RefillPolicy::Cluster,
            pcp_high: PcpHighPolicy::Auto,
            nr_cpus: 1,
            pcp_batch: None,
            pcp_cache: true,
        }
    }
}
