//! Building an [`Mm`]: [`MmBuilder`] (the arena, the policies, clearing,
//! fault-around, compaction) and [`Variant`], the named policy sets the lab
//! compares. `build` maps the arena, splits it over the topology's nodes (one
//! zone each), builds the core allocator and starts the
//! background threads (the vmstat worker under auto-tuned per-CPU `high`, and
//! kcompactd).
//!
//! Invariants: a builder is plain data until `build`; a refused `build` leaves
//! nothing behind (no mapping, no thread). No lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mmkit_core::{
    Config, LruPolicy, MergePolicy, PageAlloc, PcpHighPolicy, PcpPolicy, RefillPolicy, PAGE_SIZE,
};

use crate::compaction::{self, CompactConfig};
use crate::kthread::Kthread;
use crate::numa_balancing::{self, ScanParams, ScanPolicy, ScanTrigger};
use crate::swapfile::SwapDevices;
use crate::thrash::LoadControl;
use crate::{
    arena, numa, platform, ClearPlan, ClearStrategy, Error, Mm, MmInner, PlanSource, StdPlatform,
    Topology,
};
use crate::{SwapAllocPolicy, SwapCacheIndex, SwapFreePolicy, SwapReadahead};

/// The named policy sets the lab compares.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The best defaults: PCP with auto-tuned high, lazy order-0 merging with merge
    /// on demand, cluster refill.
    Mmkit,
    /// Linux before the zone-lock work: PCP with fixed high, eager merging,
    /// page-by-page refill.
    MmkitEager,
    /// No per-CPU lists, eager merging: every call takes the zone lock.
    MmkitNoPcp,
    /// `Mmkit` with lazy order-0 merging but no merge on demand
    /// (`MergePolicy::LazyNoMerge`): Linux's first skip-merge patch alone, fast for
    /// order 0 and poor for huge pages; compaction migrates as for the others but
    /// has no merge step.
    MmkitNoMerge,
    /// `Mmkit`'s allocator with swap as Linux had it before the seed:
    /// [`SwapAllocPolicy::SharedCursor`] and [`SwapCacheIndex::Trunks`].
    MmkitSwap2019,
    /// The seed (2020): [`SwapAllocPolicy::PerCpuCursor`] and
    /// [`SwapCacheIndex::Trunks`].
    MmkitSwap2020,
    /// Linux 6.18: [`SwapAllocPolicy::PerCpuCluster`] and [`SwapCacheIndex::Table`].
    MmkitSwap618,
    /// `Mmkit` with Linux's NUMA balancing scan policy as it is today
    /// ([`ScanPolicy::FailBackoff`], Mel Gorman's "mm: numa: Slow PTE scan rate
    /// if migration failures occur").
    MmkitNumabLinux,
    /// `Mmkit` with Linux 4.0-rc1's ([`ScanPolicy::NoFailBackoff`]).
    MmkitNumab40,
    /// `Mmkit` whose spaces leave NUMA balancing off (the lab does not turn it
    /// on; the builder's scan policy stays `Adaptive`).
    MmkitNumabOff,
    /// `Mmkit` with Linux 6.18's classic anon LRU rules
    /// ([`LruPolicy::Classic`]) instead of the probation/protected lists.
    MmkitLruClassic,
    /// `Mmkit` with working-set load control under thrashing
    /// ([`LoadControl::WorkingSet`]): groups of spaces whose working sets fit
    /// take turns (in the spirit of Linux's swap token, gone since 3.5).
    MmkitLoadctl,
}

impl Variant {
    /// All variants.
    pub const ALL: [Variant; 7] = [
        Variant::Mmkit,
        Variant::MmkitEager,
        Variant::MmkitNoPcp,
        Variant::MmkitNoMerge,
        Variant::MmkitSwap2019,
        Variant::MmkitSwap2020,
        Variant::MmkitSwap618,
    ];
    /// The lab name.
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Mmkit => "mmkit",
            Variant::MmkitEager => "mmkit-eager",
            Variant::MmkitNoPcp => "mmkit-nopcp",
            Variant::MmkitNoMerge => "mmkit-nomerge",
            Variant::MmkitSwap2019 => "mmkit-swap-2019",
            Variant::MmkitSwap2020 => "mmkit-swap-2020",
            Variant::MmkitSwap618 => "mmkit-swap-6.18",
            Variant::MmkitNumabLinux => "mmkit-numab-linux",
            Variant::MmkitNumab40 => "mmkit-numab-4.0",
            Variant::MmkitNumabOff => "mmkit-numab-off",
            Variant::MmkitLruClassic => "mmkit-lru-classic",
            Variant::MmkitLoadctl => "mmkit-loadctl",
        }
    }
    /// The load-control variants (`mmkit` is the `Off` one).
    pub const LOADCTL: [Variant; 2] = [Variant::Mmkit, Variant::MmkitLoadctl];
    /// Load control under thrashing: the swap token for `mmkit-loadctl`, off
    /// for the others.
    pub const fn load_control(self) -> LoadControl {
        match self {
            Variant::MmkitLoadctl => LoadControl::SwapToken,
            _ => LoadControl::Off,
        }
    }
    /// The eviction policy variants (`mmkit` is the `Protected` one).
    pub const LRU: [Variant; 2] = [Variant::Mmkit, Variant::MmkitLruClassic];
    /// The anonymous LRU's eviction policy: Linux 6.18's classic rules for
    /// `mmkit-lru-classic`, mmkit's for the others (the allocator and swap
    /// baselines compare those mechanisms alone).
    pub const fn lru_policy(self) -> LruPolicy {
        match self {
            Variant::MmkitLruClassic => LruPolicy::Classic,
            _ => LruPolicy::Protected,
        }
    }
    /// The NUMA balancing variants (`mmkit` is the Adaptive one).
    pub const NUMAB: [Variant; 4] = [
        Variant::Mmkit,
        Variant::MmkitNumabLinux,
        Variant::MmkitNumab40,
        Variant::MmkitNumabOff,
    ];
    /// From a lab name.
    pub fn from_name(s: &str) -> Option<Variant> {
        Variant::ALL
            .into_iter()
            .chain(Variant::NUMAB)
            .chain(Variant::LRU)
            .chain(Variant::LOADCTL)
            .find(|v| v.name() == s)
    }
    /// The NUMA balancing scan policy, or None where balancing stays off.
    pub const fn numa_balancing(self) -> Option<ScanPolicy> {
        match self {
            Variant::MmkitNumabLinux => Some(ScanPolicy::FailBackoff),
            Variant::MmkitNumab40 => Some(ScanPolicy::NoFailBackoff),
            Variant::MmkitNumabOff => None,
            _ => Some(ScanPolicy::Adaptive),
        }
    }
    /// Anonymous fault-around batch: 16 pages for the mmkit policies, off (1) for
    /// the Linux baselines.
    pub const fn fault_around(self) -> usize {
        match self {
            Variant::MmkitEager | Variant::MmkitNoPcp => 1,
            _ => 16,
        }
    }
    /// Swap-slot allocation and swap-cache index (mmkit's: per-CPU clusters and
    /// the per-cluster table, as Linux 6.18).
    pub const fn swap_policies(self) -> (SwapAllocPolicy, SwapCacheIndex) {
        match self {
            Variant::MmkitSwap2019 => (SwapAllocPolicy::SharedCursor, SwapCacheIndex::Trunks),
            Variant::MmkitSwap2020 => (SwapAllocPolicy::PerCpuCursor, SwapCacheIndex::Trunks),
            _ => (SwapAllocPolicy::PerCpuCluster, SwapCacheIndex::Table),
        }
    }
    /// Sharded LRU lists (a shard per CPU and node, mmkit's), or one pair of
    /// lists per node behind one lock (Linux's `lru_lock`, the baselines').
    pub const fn lru_sharded(self) -> bool {
        !matches!(
            self,
            Variant::MmkitSwap2019 | Variant::MmkitSwap2020 | Variant::MmkitSwap618
        )
    }
    /// When a swapped-in page frees its slot: Linux's half-full rule for the
    /// Linux baselines, mmkit's keep-while-room otherwise.
    pub const fn swap_free_policy(self) -> SwapFreePolicy {
        match self {
            Variant::MmkitSwap2019 | Variant::MmkitSwap2020 | Variant::MmkitSwap618 => {
                SwapFreePolicy::HalfFull
            }
            _ => SwapFreePolicy::KeepWhileRoom,
        }
    }
    fn apply(self, c: &mut Config) {
        let (pcp, merge, refill, high) = match self {
            Variant::Mmkit
            | Variant::MmkitSwap2019
            | Variant::MmkitSwap2020
            | Variant::MmkitSwap618
            | Variant::MmkitNumabLinux
            | Variant::MmkitNumab40
            | Variant::MmkitNumabOff
            | Variant::MmkitLruClassic
            | Variant::MmkitLoadctl => (
                PcpPolicy::On,
                MergePolicy::Lazy,
                RefillPolicy::Cluster,
                PcpHighPolicy::Auto,
            ),
            Variant::MmkitEager => (
                PcpPolicy::On,
                MergePolicy::Eager,
                RefillPolicy::PageByPage,
                PcpHighPolicy::Fixed,
            ),
            Variant::MmkitNoPcp => (
                PcpPolicy::Off,
                MergePolicy::Eager,
                RefillPolicy::PageByPage,
                PcpHighPolicy::Fixed,
            ),
            Variant::MmkitNoMerge => (
                PcpPolicy::On,
                MergePolicy::LazyNoMerge,
                RefillPolicy::Cluster,
                PcpHighPolicy::Auto,
            ),
        };
        c.pcp = pcp;
        // The lock-free per-CPU caches are mmkit's; the baselines are Linux's lists.
        c.pcp_cache = !matches!(self, Variant::MmkitEager | Variant::MmkitNoPcp);
        c.merge = merge;
        c.refill = refill;
        c.pcp_high = high;
    }
}

/// Builds an [`Mm`]: the arena's size and backing, the policies (one by one or as a
/// [`Variant`]), clearing, fault-around and compaction.
#[derive(Clone, Debug)]
pub struct MmBuilder {
    memory: Option<usize>,
    cfg: Config,
    hugetlb: bool,
    prefault: bool,
    clear: ClearStrategy,
    clear_plan: Option<ClearPlan>,
    fault_around: usize,
    compact: CompactConfig,
    topology: Option<Topology>,
    swap_alloc: SwapAllocPolicy,
    swap_cache: SwapCacheIndex,
    swap_free: SwapFreePolicy,
    swap_ra: SwapReadahead,
    lru_sharded: bool,
    lru_policy: LruPolicy,
    load_control: LoadControl,
    kswapd: bool,
    numab: (ScanPolicy, ScanParams, ScanTrigger),
}

/// A quarter of RAM, capped at 4 GiB.
fn default_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, psize) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = (pages.max(0) as usize).saturating_mul(psize.max(0) as usize);
    (ram / 4).clamp(64 << 20, 4 << 30)
}

impl MmBuilder {
    /// The `mmkit` variant's policies and one per-CPU slot per CPU.
    pub(crate) fn new() -> Self {
        let mut cfg = Config {
            nr_cpus: platform::nr_cpus(),
            ..Config::default()
        };
        Variant::Mmkit.apply(&mut cfg);
        MmBuilder {
            memory: None,
            cfg,
            hugetlb: false,
            prefault: false,
            clear: ClearStrategy::Auto,
            clear_plan: None,
            fault_around: Variant::Mmkit.fault_around(),
            compact: CompactConfig::default(),
            topology: None,
            swap_alloc: SwapAllocPolicy::PerCpuCluster,
            swap_cache: SwapCacheIndex::Table,
            swap_free: SwapFreePolicy::KeepWhileRoom,
            swap_ra: SwapReadahead::Vma,
            lru_sharded: true,
            lru_policy: LruPolicy::Protected,
            load_control: Variant::Mmkit.load_control(),
            kswapd: true,
            numab: (
                ScanPolicy::Adaptive,
                ScanParams::default(),
                ScanTrigger::TaskCpu,
            ),
        }
    }

    /// How NUMA balancing adapts each space's scan period (default
    /// [`ScanPolicy::Adaptive`]; a [`Variant`] sets it too).
    pub fn numa_scan_policy(mut self, p: ScanPolicy) -> Self {
        self.numab.0 = p;
        self
    }
    /// The NUMA balancing scanner's settings (default: Linux's sysctls).
    pub fn numa_scan_params(mut self, p: ScanParams) -> Self {
        self.numab.1 = p;
        self
    }
    /// What drives the automatic scanner of a space with NUMA balancing on
    /// (default [`ScanTrigger::TaskCpu`]: the CPU time of the space's threads,
    /// as Linux).
    pub fn numa_scan_trigger(mut self, t: ScanTrigger) -> Self {
        self.numab.2 = t;
        self
    }
    /// The wall-clock background scanner thread per space
    /// ([`ScanTrigger::Wall`]) when on; off, no automatic scanning at all
    /// ([`ScanTrigger::Manual`]: only
    /// [`Space::task_numa_work`](crate::Space::task_numa_work) scans, tests drive
    /// it by hand).
    pub fn numa_scan_thread(self, on: bool) -> Self {
        self.numa_scan_trigger(if on {
            ScanTrigger::Wall
        } else {
            ScanTrigger::Manual
        })
    }
    /// The NUMA topology (default [`Topology::host`]: the host's nodes, one on
    /// most machines). The arena is split over its nodes in equal shares of
    /// 4 MiB blocks, each node a zone with its own watermarks, lists and
    /// counters; on a real multi-node host each part is bound to its node with
    /// `mbind` (a refusal is reported by [`Mm::numa_note`], not an error).
    pub fn topology(mut self, t: Topology) -> Self {
        self.topology = Some(t);
        self
    }

    /// How swap slots are allocated (default [`SwapAllocPolicy::PerCpuCluster`]).
    pub fn swap_alloc(mut self, p: SwapAllocPolicy) -> Self {
        self.swap_alloc = p;
        self
    }

    /// How the swap cache is indexed (default [`SwapCacheIndex::Table`]).
    pub fn swap_cache(mut self, i: SwapCacheIndex) -> Self {
        self.swap_cache = i;
        self
    }

    /// LRU lists sharded per CPU (default true, mmkit's), or one pair per
    /// node under one lock (false, Linux's).
    pub fn lru_sharded(mut self, on: bool) -> Self {
        self.lru_sharded = on;
        self
    }

    /// The anonymous LRU's eviction policy (default [`LruPolicy::Protected`],
    /// mmkit's; [`LruPolicy::Classic`] is Linux 6.18's).
    pub fn lru_policy(mut self, p: LruPolicy) -> Self {
        self.lru_policy = p;
        self
    }

    /// Load control when address spaces thrash (default [`LoadControl::Off`]:
    /// every space runs; [`LoadControl::WorkingSet`]: groups of spaces whose
    /// working sets fit take turns).
    pub fn load_control(mut self, lc: LoadControl) -> Self {
        self.load_control = lc;
        self
    }

    /// What a swap-in reads ahead (default [`SwapReadahead::Vma`], as Linux's;
    /// its window closes by itself under random access).
    pub fn swap_readahead(mut self, ra: SwapReadahead) -> Self {
        self.swap_ra = ra;
        self
    }

    /// When a page read back from swap frees its slot (default:
    /// `KeepWhileRoom`; Linux's rule is `HalfFull`).
    pub fn swap_free(mut self, p: SwapFreePolicy) -> Self {
        self.swap_free = p;
        self
    }

    /// The background reclaim threads, one kswapd per node (default on; off,
    /// only direct reclaim frees memory).
    pub fn kswapd(mut self, on: bool) -> Self {
        self.kswapd = on;
        self
    }

    /// Arena size in bytes (rounded down to 4 KiB; at least 2 MiB).
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = Some(bytes);
        self
    }
    /// A named policy set.
    pub fn variant(mut self, v: Variant) -> Self {
        v.apply(&mut self.cfg);
        self.fault_around = v.fault_around();
        (self.swap_alloc, self.swap_cache) = v.swap_policies();
        self.swap_free = v.swap_free_policy();
        self.lru_sharded = v.lru_sharded();
        self.lru_policy = v.lru_policy();
        self.load_control = v.load_control();
        if let Some(p) = v.numa_balancing() {
            self.numab.0 = p;
        }
        self
    }
    /// Anonymous fault-around: a fault on an order-0 mapping also populates up to
    /// `pages - 1` following empty entries of the same page table and mapping, in
    /// one batch (1 = off, Linux's anonymous behaviour; at most 64).
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.fault_around = pages.clamp(1, 64);
        self
    }
    /// Per-CPU lists on/off.
    pub fn pcp(mut self, p: PcpPolicy) -> Self {
        self.cfg.pcp = p;
        self
    }
    /// Merging policy.
    pub fn merge(mut self, m: MergePolicy) -> Self {
        self.cfg.merge = m;
        self
    }
    /// Refill policy.
    pub fn refill(mut self, r: RefillPolicy) -> Self {
        self.cfg.refill = r;
        self
    }
    /// Per-CPU `high` policy.
    pub fn pcp_high(mut self, h: PcpHighPolicy) -> Self {
        self.cfg.pcp_high = h;
        self
    }
    /// Lock-free per-CPU order-0 caches driven by restartable sequences in front
    /// of the per-CPU lists (default on for `mmkit`; used where the kernel and libc
    /// provide rseq and membarrier, otherwise every call takes the lists' lock).
    pub fn pcp_cache(mut self, on: bool) -> Self {
        self.cfg.pcp_cache = on;
        self
    }
    /// Per-CPU batch (default derived from the zone size).
    pub fn pcp_batch(mut self, b: u32) -> Self {
        self.cfg.pcp_batch = Some(b);
        self
    }
    /// Number of per-CPU slots (default: the CPUs the system may bring online).
    pub fn cpus(mut self, n: usize) -> Self {
        self.cfg.nr_cpus = n;
        self
    }
    /// Try hugetlb backing; falls back to THP with a message when refused.
    pub fn hugetlb(mut self, on: bool) -> Self {
        self.hugetlb = on;
        self
    }
    /// How pages are cleared on `Gfp::ZERO` and in the fault path (default `Auto`).
    pub fn clear(mut self, c: ClearStrategy) -> Self {
        self.clear = c;
        self
    }
    /// What [`ClearStrategy::Auto`] runs where, instead of the plan calibrated
    /// on this host (or given by `MMKIT_CLEAR_PLAN`; see
    /// [`clear_calibration`](crate::clear_calibration)). The plan's source
    /// becomes `Override`; a plan whose kernels are `Auto` is refused at build.
    pub fn clear_plan(mut self, plan: ClearPlan) -> Self {
        self.clear_plan = Some(ClearPlan {
            source: PlanSource::Override,
            ..plan
        });
        self
    }
    /// Fault the whole arena in at build time.
    pub fn prefault(mut self, on: bool) -> Self {
        self.prefault = on;
        self
    }
    /// Direct compaction in the allocation slow path of high-order requests
    /// (default on).
    pub fn compaction(mut self, on: bool) -> Self {
        self.compact.direct = on;
        self
    }
    /// The background compaction thread, kcompactd (default on).
    pub fn kcompactd(mut self, on: bool) -> Self {
        self.compact.kcompactd = on;
        self
    }
    /// Linux's `vm.compaction_proactiveness`, 0..=100 (default 20): kcompactd
    /// compacts in the background while the fragmentation score is above
    /// `110 - proactiveness`, down to `100 - proactiveness`; 0 turns it off.
    pub fn compaction_proactiveness(mut self, p: u32) -> Self {
        self.compact.proactiveness = p.min(100);
        self
    }
    /// Maps the arena and builds the allocator.
    pub fn build(self) -> Result<Mm, Error> {
        let len = self.memory.unwrap_or_else(default_memory) & !(PAGE_SIZE - 1);
        if len < (2 << 20) {
            return Err(Error::Config(format!(
                "memory {len} bytes is below the 2 MiB minimum (one pageblock)"
            )));
        }
        let clear_plan = match self.clear_plan {
            Some(p) if !p.is_valid() => {
                return Err(Error::Config(format!(
                    "clear plan {p}: a kernel is auto; use page-at-a-time, multi-page or \
                     non-temporal"
                )))
            }
            Some(p) => p,
            None if self.clear == ClearStrategy::Auto => crate::calibrate::clear_plan()?,
            // An explicit strategy never consults the plan: do not measure for it.
            None => ClearPlan::from_cpuid(),
        };
        let arena = arena::Arena::new(len, self.hugetlb, self.prefault)
            .map_err(|e| Error::Arena(format!("mmap of {len} bytes failed: {e}")))?;
        let topology = self.topology.clone().unwrap_or_else(Topology::host);
        let nr_pages = (len / PAGE_SIZE) as u64;
        let mut numa_note = None;
        let alloc = if topology.nr_nodes() == 1 {
            PageAlloc::<StdPlatform>::new(self.cfg.clone(), nr_pages)
        } else {
            let parts = numa::node_pages(&topology, nr_pages)?;
            if !topology.is_emulated() {
                numa_note = bind_parts(&arena, &parts);
            }
            PageAlloc::<StdPlatform>::with_nodes(
                self.cfg.clone(),
                &parts,
                topology.zonelists().clone(),
            )
        }
        .map_err(|e| Error::Config(e.to_string()))?;
        let node_access = numa::AccessCounters::new(topology.nr_nodes(), self.cfg.nr_cpus);
        let nr_nodes = alloc.nr_nodes();
        let nr_cpus = self.cfg.nr_cpus;
        let mut wmark_high = vec![0; nr_nodes];
        for z in alloc.zone_info() {
            wmark_high[z.node.min(nr_nodes - 1)] += z.wmark[2];
        }
        let memcg = Arc::new(crate::memcontrol::MemCgTable::new(
            nr_pages, nr_nodes, nr_cpus,
        ));
        let inner = Arc::new(MmInner {
            alloc,
            arena,
            clear: self.clear,
            clear_plan,
            fault_around: self.fault_around,
            vmstat: Kthread::new(),
            compact: self.compact,
            kcompactd: self.compact.kcompactd.then(Kthread::new),
            compacting: AtomicUsize::new(0),
            spaces: Default::default(),
            page_locks: crate::rmap::PageLocks::new(nr_pages),
            topology,
            id: NEXT_MM_ID.fetch_add(1, Ordering::Relaxed),
            node_access,
            numa_note,
            lru: crate::lru::Lru::new(
                nr_pages,
                nr_nodes,
                nr_cpus,
                self.lru_sharded,
                self.lru_policy,
            ),
            memcg: memcg.clone(),
            swap: SwapDevices::new(
                self.swap_alloc,
                self.swap_cache,
                self.swap_free,
                self.swap_ra,
                nr_cpus,
            ),
            kswapd: (0..if self.kswapd { nr_nodes } else { 0 })
                .map(|_| Kthread::new())
                .collect(),
            thrash: crate::thrash::Thrash::new(
                self.load_control,
                nr_pages.saturating_sub(wmark_high.iter().sum()),
            ),
            wmark_high,
            numab: numa_balancing::MmNumab {
                policy: self.numab.0,
                params: self.numab.1,
                trigger: self.numab.2,
                stats: Default::default(),
            },
        });
        inner.swap.set_memcg(memcg);
        crate::kswapd::start_kswapd(&inner);
        if self.cfg.pcp == PcpPolicy::On && self.cfg.pcp_high == PcpHighPolicy::Auto {
            start_vmstat_worker(&inner);
        }
        if let Some(kc) = &inner.kcompactd {
            compaction::start_kcompactd(&inner, kc);
        }
        Ok(Mm { inner })
    }
}

/// Ids of Mms (the thread-to-node bindings are keyed by them).
static NEXT_MM_ID: AtomicU64 = AtomicU64::new(1);

/// Binds each node's part of the arena to its node; the note of the first
/// refusal (the parts stay unbound, which is correct, only slower).
fn bind_parts(arena: &arena::Arena, parts: &[u64]) -> Option<String> {
    let mut off = 0usize;
    for (node, &pages) in parts.iter().enumerate() {
        let len = pages as usize * PAGE_SIZE;
        // SAFETY: `off + len <= arena.len()`: the parts sum to the arena's pages.
        let addr = unsafe { arena.base().add(off) };
        if let Err(e) = numa::mbind_range(addr, len, node) {
            let msg = format!(
                "mbind of node {node}'s part refused ({e}); the arena is not bound to its nodes"
            );
            eprintln!("mmkit: {msg}");
            return Some(msg);
        }
        off += len;
    }
    None
}

/// The per-second worker (Linux's vmstat_update): decays per-CPU `high`.
fn start_vmstat_worker(inner: &Arc<MmInner>) {
    let weak = Arc::downgrade(inner);
    inner.vmstat.start(
        "mmkit-vmstat",
        Duration::from_secs(1),
        move |()| match weak.upgrade() {
            Some(mm) => {
                mm.alloc.decay_pcp_high();
                true
            }
            None => false,
        },
    );
}
