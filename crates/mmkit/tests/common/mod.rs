//! Helpers shared by the mmkit integration tests: building an `Mm` for a
//! variant / merge policy, and stamping / verifying patterns in blocks.
#![allow(dead_code)]

use mmkit::{MapFlags, MergePolicy, Mm, Pfn, Space, Variant};

pub const MIB: u64 = 1 << 20;

/// Both merge policies, for tests that run once per policy.
pub const MERGES: [MergePolicy; 2] = [MergePolicy::Eager, MergePolicy::Lazy];

/// Build an allocator over `mem_bytes` of arena for `variant`, optionally
/// overriding its merge policy.
pub fn build(variant: Variant, merge: Option<MergePolicy>, mem_bytes: u64) -> Mm {
    let mut b = Mm::builder()
        .memory(mem_bytes as _)
        .variant(variant)
        .hugetlb(false);
    if let Some(m) = merge {
        b = b.merge(m);
    }
    b.build().unwrap_or_else(|e| {
        panic!(
            "building mm ({}, {merge:?}, {mem_bytes} bytes) failed: {e:?}",
            variant.name()
        )
    })
}

/// Number of pfns the arena spans (valid pfns are `0..nr_spanned`).
pub fn nr_spanned(mem_bytes: u64) -> u64 {
    mem_bytes / PAGE as u64
}

/// `mmkit::PAGE_SIZE` (checked in views.rs `constants_match_contract`).
pub const PAGE: usize = 4096;

/// `mmkit::MAX_ORDER` (checked in views.rs `constants_match_contract`).
pub const TOP_ORDER: u32 = 10;
pub const WORDS_PER_PAGE: usize = PAGE / 8;

/// Pointer to word `w` of page `page` of the block starting at `pfn`.
pub fn word_ptr(mm: &Mm, pfn: Pfn, page: u64, w: usize) -> *mut u64 {
    let base = mm.page_address(pfn);
    assert!(!base.is_null(), "page_address({pfn:?}) is null");
    // SAFETY: the block is 2^order pages long and page < 2^order; w < 512.
    unsafe { base.add(page as usize * PAGE + w * 8) as *mut u64 }
}

pub fn write_word(mm: &Mm, pfn: Pfn, page: u64, w: usize, v: u64) {
    // SAFETY: the block is owned by the caller and writable.
    unsafe { word_ptr(mm, pfn, page, w).write_volatile(v) }
}

pub fn read_word(mm: &Mm, pfn: Pfn, page: u64, w: usize) -> u64 {
    // SAFETY: the block is owned by the caller and readable.
    unsafe { word_ptr(mm, pfn, page, w).read_volatile() }
}

/// True if every byte of the 2^order-page block at `pfn` is zero.
pub fn block_is_zero(mm: &Mm, pfn: Pfn, order: u32) -> Result<(), String> {
    let base = mm.page_address(pfn) as *const u64;
    let words = (1usize << order) * WORDS_PER_PAGE;
    // SAFETY: the block is 2^order pages, owned by the caller.
    let s = unsafe { std::slice::from_raw_parts(base, words) };
    match s.iter().position(|&w| w != 0) {
        None => Ok(()),
        Some(i) => Err(format!(
            "ZERO block pfn {} order {order}: word {i} (page {}) is {:#x}",
            pfn.get(),
            i / WORDS_PER_PAGE,
            s[i]
        )),
    }
}

/// `per_variant! { name, ... }` generates `mod name { mmkit, mmkit_eager,
/// mmkit_nopcp }`, three tests that call `name(variant)` from the parent.
#[allow(unused_macros)]
macro_rules! per_variant {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use mmkit::Variant;
            #[test]
            fn mmkit() {
                super::$name(Variant::Mmkit)
            }
            #[test]
            fn mmkit_eager() {
                super::$name(Variant::MmkitEager)
            }
            #[test]
            fn mmkit_nopcp() {
                super::$name(Variant::MmkitNoPcp)
            }
        }
    )*};
}

/// Like `per_variant!`, but six tests calling `name(variant, merge)` for each
/// variant and each `MergePolicy`.
#[allow(unused_macros)]
macro_rules! per_variant_and_merge {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use mmkit::{MergePolicy, Variant};
            #[test]
            fn mmkit_merge_eager() {
                super::$name(Variant::Mmkit, MergePolicy::Eager)
            }
            #[test]
            fn mmkit_merge_lazy() {
                super::$name(Variant::Mmkit, MergePolicy::Lazy)
            }
            #[test]
            fn mmkit_eager_merge_eager() {
                super::$name(Variant::MmkitEager, MergePolicy::Eager)
            }
            #[test]
            fn mmkit_eager_merge_lazy() {
                super::$name(Variant::MmkitEager, MergePolicy::Lazy)
            }
            #[test]
            fn mmkit_nopcp_merge_eager() {
                super::$name(Variant::MmkitNoPcp, MergePolicy::Eager)
            }
            #[test]
            fn mmkit_nopcp_merge_lazy() {
                super::$name(Variant::MmkitNoPcp, MergePolicy::Lazy)
            }
        }
    )*};
}

/// Pin the calling thread to the CPU it is on (mmkit picks the per-CPU list by
/// `sched_getcpu`), for tests that want one CPU's lists to see every call. The
/// exact counts of exhaustion do not depend on it (tests/limits.rs does not pin).
pub fn pin_to_current_cpu() {
    // SAFETY: plain libc calls on a zeroed cpu_set_t owned by this frame.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A space of `pages` 4 KiB pages, page `i` filled with the byte `i`, first
/// touched from node 0 (before balancing is on, so the layout costs no scan
/// time), then NUMA balancing on.
pub fn space_on_node0(mm: &Mm, pages: u64) -> (Space, u64) {
    const PAGE: u64 = 4096;
    mm.set_thread_node(0).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    for i in 0..pages {
        s.write(a + i * PAGE, &[i as u8; PAGE as usize]).unwrap();
    }
    s.set_numa_balancing(true);
    (s, a)
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Swap slots in use over every device.
pub fn used_swap(mm: &Mm) -> u64 {
    mm.swap_info().iter().map(|i| i.used_pages).sum()
}
