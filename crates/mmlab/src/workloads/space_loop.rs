//! The map / access / unmap loop that `page_fault1`, `anon_w_seq`, `highalloc`
//! and `order0_thp_mix` share: map an anonymous region, access each 4 KiB page
//! of it in address order (the first access of each is a page fault), unmap it,
//! again; one case of it under `run_workers` (`run_case`); and `fill`, which
//! faults a share of an mmkit instance's free memory. The same loop runs on an mmkit
//! `Space` and on this process's own memory through `libc::mmap`/`munmap`, so
//! the kernel's numbers come from exactly what a C program runs.
//!
//! A step covers at most 512 pages (2 MiB), so the runner's phase changes are
//! seen within a fraction of a millisecond; the mmap and munmap of a region fall
//! into the steps that start and end it. An op is one page accessed.

use crate::host::facts::thp_mode;
use crate::host::mem::{mmap_anon, HostMap, HUGE, PAGE};
use crate::peers::Peer;
use crate::runner::{run_workers, Measured, Timing, Worker};
use mmkit::mmkit_core::clear::{clear_page, clear_page_batch};
use mmkit::{ClearStrategy, MapFlags, Mm, Space};
use serde_json::{Map, Value};

/// Pages per step.
pub const STEP_PAGES: usize = 512;
/// What `Access::Fill` writes.
pub const FILL_BYTE: u8 = 0xa5;

/// What the loop does to each page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Write one byte (mmkit: `write(addr, &[1])`, a write fault and the store
    /// under the page lock; kernel: one volatile byte store).
    Touch,
    /// Write all 4096 bytes (mmkit: a memset inside `with_page(addr, true)`;
    /// kernel: a memset of the page).
    Fill,
}

/// Where the loop maps its regions.
pub trait Target {
    /// Maps `len` bytes of anonymous memory; `None` when refused.
    fn map(&mut self, len: usize) -> Option<u64>;
    /// Accesses the page at `addr`; false when its fault failed (out of memory).
    ///
    /// # Safety
    /// `addr` is a page of a region returned by `self.map` and not unmapped since.
    unsafe fn access(&mut self, addr: u64, how: Access) -> bool;
    /// Unmaps a region; false if refused.
    ///
    /// # Safety
    /// `addr`/`len` is a region returned by `self.map` and not unmapped since.
    unsafe fn unmap(&mut self, addr: u64, len: usize) -> bool;
}

/// An mmkit address space, shared by the threads or owned by one.
pub enum MmkitTarget<'a> {
    Shared(&'a Space),
    Own(Space),
    /// `new_space` failed: every map is refused (and counted as a failure).
    None,
}

impl MmkitTarget<'_> {
    fn space(&self) -> Option<&Space> {
        match self {
            MmkitTarget::Shared(s) => Some(s),
            MmkitTarget::Own(s) => Some(s),
            MmkitTarget::None => None,
        }
    }
}

impl Target for MmkitTarget<'_> {
    fn map(&mut self, len: usize) -> Option<u64> {
        self.space()?.mmap(len, mmkit::MapFlags::empty()).ok()
    }

    unsafe fn access(&mut self, addr: u64, how: Access) -> bool {
        let Some(s) = self.space() else { return false };
        match how {
            Access::Touch => s.write(addr, &[1]).is_ok(),
            Access::Fill => s.with_page(addr, true, |p| p.fill(FILL_BYTE)).is_ok(),
        }
    }

    unsafe fn unmap(&mut self, addr: u64, len: usize) -> bool {
        self.space().is_some_and(|s| s.munmap(addr, len).is_ok())
    }
}

/// This process's own memory: `mmap(NULL, len, PROT_READ | PROT_WRITE,
/// MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)`, stores, `munmap`.
pub struct KernelTarget;

impl Target for KernelTarget {
    fn map(&mut self, len: usize) -> Option<u64> {
        mmap_anon(len, 0).ok().map(|p| p.as_ptr() as u64)
    }

    unsafe fn access(&mut self, addr: u64, how: Access) -> bool {
        let p = addr as *mut u8;
        match how {
            // SAFETY: by this function's contract `p` is a page of a live private
            // anonymous read/write mapping of ours.
            Access::Touch => unsafe { p.write_volatile(1) },
            // SAFETY: as above; the page is 4096 bytes (a memset call).
            Access::Fill => unsafe { std::ptr::write_bytes(p, FILL_BYTE, PAGE) },
        }
        true
    }

    unsafe fn unmap(&mut self, addr: u64, len: usize) -> bool {
        // SAFETY: `addr`/`len` is a mapping returned by `map` (this function's
        // contract); no reference into it exists.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) == 0 }
    }
}

/// The map / access every page / unmap loop on a `Target`.
pub struct MapAccessLoop<T: Target> {
    target: T,
    len: usize,
    how: Access,
    /// The mapped region and the offset of the next page to access.
    region: Option<u64>,
    off: usize,
    failures: u64,
}

impl<T: Target> MapAccessLoop<T> {
    /// Regions of `len` bytes (a multiple of 4 KiB).
    pub fn new(target: T, len: usize, how: Access) -> Self {
        MapAccessLoop {
            target,
            len,
            how,
            region: None,
            off: 0,
            failures: 0,
        }
    }

    /// Unmaps the current region `a`.
    fn unmap(&mut self, a: u64) {
        debug_assert_eq!(self.region, Some(a));
        // SAFETY: `a` is the live region (`self.region`) of `len` bytes from
        // `self.target.map`, unmapped only here, after which `region` is None.
        if !unsafe { self.target.unmap(a, self.len) } {
            self.failures += 1;
        }
        self.region = None;
    }
}

impl<T: Target> Worker for MapAccessLoop<T> {
    fn step(&mut self) -> u64 {
        let a = match self.region {
            Some(a) => a,
            None => match self.target.map(self.len) {
                Some(a) => {
                    self.region = Some(a);
                    self.off = 0;
                    a
                }
                None => {
                    self.failures += 1;
                    std::thread::yield_now();
                    return 0;
                }
            },
        };
        let end = (self.off + STEP_PAGES * PAGE).min(self.len);
        let mut n = 0;
        while self.off < end {
            // SAFETY: `a` is our live region of `len` bytes and off < len.
            if !unsafe { self.target.access(a + self.off as u64, self.how) } {
                // Out of memory: give the region back and start over.
                self.failures += 1;
                self.unmap(a);
                std::thread::yield_now();
                return n;
            }
            self.off += PAGE;
            n += 1;
        }
        if self.off >= self.len {
            self.unmap(a);
        }
        n
    }

    fn finish(&mut self) {
        if let Some(a) = self.region {
            self.unmap(a);
        }
    }

    fn failures(&self) -> u64 {
        self.failures
    }
}

/// The bound of `page_fault1`: `clear_page` on each 4 KiB page of a buffer of the
/// region's size, allocated and faulted in beforehand (2 MiB aligned and advised
/// for huge pages, like mmkit's arena), in address order, wrapping around. An op
/// is one page cleared. With `streaming`, the pages are cleared the way mmkit's
/// fault path clears the fault-around batch of a sparse first touch instead:
/// `clear_page_batch` with streaming stores, `STREAM_BATCH` pages per `sfence`.
pub struct ClearOnly {
    buf: Option<HostMap>,
    off: usize,
    streaming: bool,
}

/// Pages per `sfence` of the streaming clear-only loop: mmkit's default
/// fault-around batch.
pub const STREAM_BATCH: usize = 16;

impl ClearOnly {
    /// A buffer of `len` bytes (rounded up to 2 MiB); without memory for it every
    /// step is a failure.
    pub fn new(len: usize, streaming: bool) -> ClearOnly {
        let len = len.div_ceil(HUGE) * HUGE;
        ClearOnly {
            buf: HostMap::huge_aligned(len, true).ok(),
            off: 0,
            streaming,
        }
    }
}

impl Worker for ClearOnly {
    fn step(&mut self) -> u64 {
        let Some(buf) = &self.buf else {
            std::thread::yield_now();
            return 0;
        };
        if self.streaming {
            for _ in 0..STEP_PAGES / STREAM_BATCH {
                let base = buf.ptr().wrapping_add(self.off);
                // SAFETY: off + STREAM_BATCH * 4096 <= buf.bytes() (off is a
                // multiple of that below it, and the size is a multiple of 2 MiB);
                // the pages are distinct and the buffer is ours.
                unsafe {
                    clear_page_batch(
                        (0..STREAM_BATCH).map(|i| base.add(i * PAGE)),
                        ClearStrategy::NonTemporal,
                        0..0,
                    )
                };
                self.off += STREAM_BATCH * PAGE;
                if self.off >= buf.bytes() {
                    self.off = 0;
                }
            }
            return STEP_PAGES as u64;
        }
        for _ in 0..STEP_PAGES {
            // SAFETY: off + 4096 <= buf.bytes() (off is a multiple of 4096 below
            // it, and the size is a multiple of 2 MiB); the buffer is ours.
            unsafe { clear_page(buf.ptr().add(self.off)) };
            self.off += PAGE;
            if self.off >= buf.bytes() {
                self.off = 0;
            }
        }
        STEP_PAGES as u64
    }

    fn failures(&self) -> u64 {
        u64::from(self.buf.is_none())
    }
}

/// One case of a map / access / unmap workload on `peer`: mmkit in one shared
/// Space or one Space per thread, the kernel, or clear-only.
pub fn run_case(
    peer: &Peer,
    threads: usize,
    timing: &Timing,
    len: usize,
    how: Access,
    shared: bool,
) -> Measured {
    match (peer.mm(), peer.native()) {
        (Some(mm), _) if shared => {
            let space = mm.new_space().ok();
            run_workers(peer, threads, timing, |_| {
                let t = space
                    .as_ref()
                    .map_or(MmkitTarget::None, MmkitTarget::Shared);
                MapAccessLoop::new(t, len, how)
            })
        }
        (Some(mm), _) => run_workers(peer, threads, timing, |_| {
            let t = mm.new_space().map_or(MmkitTarget::None, MmkitTarget::Own);
            MapAccessLoop::new(t, len, how)
        }),
        (None, Some("clear-only")) => {
            run_workers(peer, threads, timing, |_| ClearOnly::new(len, false))
        }
        (None, Some("clear-only-nt")) => {
            run_workers(peer, threads, timing, |_| ClearOnly::new(len, true))
        }
        _ => run_workers(peer, threads, timing, |_| {
            MapAccessLoop::new(KernelTarget, len, how)
        }),
    }
}

/// The params of a map-access-unmap workload: bytes per thread's region, the
/// mmkit arena, and the host's THP mode.
pub fn region_params(region: usize, arena: usize) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert("region_bytes".into(), (region as u64).into());
    p.insert("memory_bytes".into(), (arena as u64).into());
    p.insert("host_thp".into(), thp_mode().into());
    p
}

/// Maps `pct`% of the free memory in `s` and writes every page; returns the
/// region (address, pages), or `None` when even that failed.
pub fn fill(mm: &Mm, s: &Space, pct: u64) -> Option<(u64, u64)> {
    mm.drain_all_pages();
    let free = mm.nr_free_pages();
    // One PTE table per 512 pages comes out of the same memory.
    let pages = (free * pct / 100) * 512 / 513;
    let page = PAGE as u64;
    let a = s.mmap((pages * page) as usize, MapFlags::empty()).ok()?;
    // Page by page: an out-of-memory stops the fill where it is, not all of it.
    let mut done = 0;
    while done < pages && s.touch(a + done * page, true).is_ok() {
        done += 1;
    }
    Some((a, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_steps<T: Target>(w: &mut MapAccessLoop<T>, steps: usize) -> u64 {
        let n = (0..steps).map(|_| w.step()).sum();
        w.finish();
        n
    }

    #[test]
    fn mmkit_loop_faults_every_page_and_frees_it() {
        let mm = mmkit::Mm::builder().memory(32 << 20).build().unwrap();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        let space = mm.new_space().unwrap();
        for how in [Access::Touch, Access::Fill] {
            // 3 MiB regions: a step of 512 pages, then one of 256 and the unmap.
            let mut w = MapAccessLoop::new(MmkitTarget::Shared(&space), 3 << 20, how);
            assert_eq!(w.step(), 512);
            assert_eq!(w.step(), 256);
            assert!(w.region.is_none(), "unmapped at the end of the region");
            assert_eq!(run_steps(&mut w, 3), 512 + 256 + 512);
            assert_eq!(w.failures(), 0);
        }
        assert_eq!(space.stats().rss_pages, 0);
        drop(space);
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
    }

    #[test]
    fn mmkit_loop_counts_out_of_memory() {
        let mm = mmkit::Mm::builder().memory(4 << 20).build().unwrap();
        let mut w = MapAccessLoop::new(
            MmkitTarget::Own(mm.new_space().unwrap()),
            8 << 20,
            Access::Touch,
        );
        let n = run_steps(&mut w, 4);
        assert!(n < 2048 && w.failures() > 0);
        let mut none = MapAccessLoop::new(MmkitTarget::None, 1 << 20, Access::Touch);
        assert_eq!(none.step(), 0);
        assert_eq!(none.failures(), 1);
    }

    #[test]
    fn kernel_loop_and_clear_only() {
        for how in [Access::Touch, Access::Fill] {
            let mut w = MapAccessLoop::new(KernelTarget, 1 << 20, how);
            assert_eq!(run_steps(&mut w, 2), 512);
            assert_eq!(w.failures(), 0);
        }
        for streaming in [false, true] {
            let mut c = ClearOnly::new(1 << 20, streaming);
            assert_eq!(c.step(), 512);
            assert_eq!(c.step(), 512);
            assert_eq!(c.failures(), 0);
        }
    }
}
