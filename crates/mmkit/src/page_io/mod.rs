//! Swap I/O (Linux's `mm/page_io.c`): the devices a slot is written to and read
//! from, and the per-slot checksum that makes a bad read an error instead of data.
//!
//! Devices:
//! - [`RamDevice`]: memory from an anonymous `mmap` (the lab's default, like the
//!   swap-slot series' DRAM-backed pmem disks); a page is copied in and out.
//! - [`FileDevice`] (`file.rs`): a real file, opened with `O_DIRECT` where the
//!   filesystem takes it (buffered I/O otherwise, e.g. an old tmpfs), through
//!   `io_uring` where the kernel offers it (`pread`/`pwrite` otherwise), both
//!   detected at open. Runs of contiguous slots are written with one request.
//! - any user [`SwapBackend`] (far memory, fault injection in tests).
//! - an NBD export (`crate::nbd`): runs written as one request, every run of
//!   a reclaim batch in flight together, reads started and waited for apart
//!   (a fault's read-ahead reads in flight with its own), freed slots trimmed.
//!
//! [`SwapIo`] adds a CRC32C (the SSE4.2 / ARMv8 instruction, through the `crc32c`
//! crate) per slot: computed on swap-out, stored once the write succeeded, checked
//! on swap-in. A mismatch is [`SwapIoError::Corrupt`]; a slot that was never
//! written (or whose write failed) reads as [`SwapIoError::NotWritten`].
//!
//! Invariants: every offset and length is a multiple of [`PAGE_SIZE`] and inside
//! the device; the checksum word of a slot is 0 from before its write starts until
//! the write succeeded, so a torn or failed write never validates.
//!
//! Locking: none of its own for the RAM device. The swap map gives a slot one
//! writer at a time and no reader while it is written (`SwapBackend`'s
//! contract: a slot is written only while freshly allocated, read only while it
//! holds `SWAP_HAS_CACHE` after its write completed, ordered by the checksum
//! word's release/acquire), so a copy is a plain `memcpy` in (`rep movsb`: no
//! read-for-ownership of the page) and non-temporal stores out (the device's
//! lines are not read again soon, so they bypass the cache). A file device
//! keeps a few `io_uring` rings, each behind a mutex held for one submission
//! and its completions. Checksums are atomics.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mmkit_core::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// A swap device a user supplies: far memory, a network store, a test double.
/// The swap layer calls it with page-aligned offsets and lengths (multiples of
/// 4096) inside the size given at `swapon`, and never with two overlapping
/// requests of which one is a write.
pub trait SwapBackend: Send + Sync {
    /// Reads `buf.len()` bytes at `offset` into `buf`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`.
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
}

fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    let len = len as u64;
    if !offset.is_multiple_of(PAGE)
        || !len.is_multiple_of(PAGE)
        || offset.checked_add(len).is_none_or(|e| e > size)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("swap I/O at {offset:#x} (+{len:#x}) is unaligned or outside the device ({size:#x} bytes)"),
        ));
    }
    Ok(())
}

/// A swap device in anonymous memory.
pub(crate) struct RamDevice {
    base: NonNull<u8>,
    size: u64,
}

// SAFETY: the mapping is owned by the device; concurrent requests touch
// disjoint slots or only read (the `SwapBackend` contract), so sharing the
// pointer between threads is sound.
unsafe impl Send for RamDevice {}
// SAFETY: as above.
unsafe impl Sync for RamDevice {}

impl RamDevice {
    /// Maps `size` bytes (a multiple of 4096) of anonymous memory, reserved
    /// lazily, or backed now with `populate`.
    pub(crate) fn new(size: u64, populate: bool) -> io::Result<RamDevice> {
        check_range(0, size as usize, size)?;
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | libc::MAP_NORESERVE
            | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RamDevice {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            size,
        })
    }
}

impl Drop for RamDevice {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no reference outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.size as usize) };
    }
}

/// Copies `len` bytes (a multiple of 64) from `src` to the 16-byte aligned `dst`
/// with non-temporal stores, then fences them (they are weakly ordered).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping, and no
/// other thread accesses `dst` meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_nontemporal(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    debug_assert!((dst as usize).is_multiple_of(16) && len.is_multiple_of(64));
    let (d, s) = (dst.cast::<__m128i>(), src.cast::<__m128i>());
    for i in (0..len / 16).step_by(4) {
        // SAFETY: i + 3 < len / 16, so every access is inside the ranges the
        // caller vouched for; `dst` is 16-byte aligned; SSE2 is baseline on x86_64.
        unsafe {
            let (a, b) = (_mm_loadu_si128(s.add(i)), _mm_loadu_si128(s.add(i + 1)));
            let (c, e) = (_mm_loadu_si128(s.add(i + 2)), _mm_loadu_si128(s.add(i + 3)));
            _mm_stream_si128(d.add(i), a);
            _mm_stream_si128(d.add(i + 1), b);
            _mm_stream_si128(d.add(i + 2), c);
            _mm_stream_si128(d.add(i + 3), e);
        }
    }
    // SAFETY: a store fence has no preconditions.
    unsafe { _mm_sfence() };
}

/// The same with a plain copy where there are no non-temporal stores.
///
/// # Safety
/// As for the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_nontemporal(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

impl SwapBackend for RamDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        // SAFETY: `check_range` put the range inside the mapping, which lives as
        // long as `self`; `buf` is a distinct allocation; no write to these slots
        // runs concurrently (the `SwapBackend` contract).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(offset as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        // SAFETY: as in `read`, and the slots' only accessor is this write (the
        // contract); the offset is page-aligned, so the destination is 16-byte
        // aligned, and the length a multiple of 4096.
        unsafe {
            copy_nontemporal(
                self.base.as_ptr().add(offset as usize),
                buf.as_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }
}

/// A raw syscall's return value as a result: negative is `errno`.
pub(crate) fn cvt(n: isize) -> io::Result<usize> {
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Runs `op` again while it fails with `EINTR` (the one retry loop of the
/// swap devices' syscalls: files, `io_uring`, NBD sockets).
pub(crate) fn retry_eintr<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// The device behind a swap area.
pub(crate) enum Backend {
    Ram(RamDevice),
    File(FileDevice),
    User(Arc<dyn SwapBackend>),
    Nbd(crate::nbd::NbdBackend),
}

impl Backend {
    fn dev(&self) -> &dyn SwapBackend {
        match self {
            Backend::Ram(d) => d,
            Backend::File(d) => d,
            Backend::User(d) => &**d,
            Backend::Nbd(d) => d,
        }
    }
}

/// Why a swap read or write failed. Clone-able (the I/O error is kept as its kind
/// and message) so that it can travel inside `mmkit::Error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SwapIoError {
    /// The device refused the request; the data stays where it was.
    #[error("swap I/O error on slot {slot}: {kind:?}: {msg}")]
    Io {
        slot: u32,
        kind: io::ErrorKind,
        msg: String,
    },
    /// The slot's content does not match the checksum written with it.
    #[error("swap slot {slot} is corrupt: CRC32C {found:#010x}, written {expected:#010x}")]
    Corrupt {
        slot: u32,
        expected: u32,
        found: u32,
    },
    /// The slot holds no successfully written page.
    #[error("swap slot {slot} was never written (or its write failed)")]
    NotWritten { slot: u32 },
}

/// A swap read started ([`SwapIo::swap_read_start`]) and not yet verified.
#[must_use = "a started read must be ended (its page is being written)"]
pub(crate) struct SwapRead {
    slot: u32,
    want: u64,
    state: ReadState,
}

enum ReadState {
    /// Read already (RAM, file, user devices).
    Done,
    /// In flight on an NBD device.
    Nbd(crate::nbd::Ticket),
}

/// Per-device I/O counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SwapIoStats {
    /// Pages read and verified (`pswpin`).
    pub pswpin: u64,
    /// Pages written (`pswpout`).
    pub pswpout: u64,
    /// Failed reads and writes.
    pub io_errors: u64,
    /// Reads refused for a checksum mismatch.
    pub checksum_errors: u64,
}

const CSUM_VALID: u64 = 1 << 32;

/// A device and the checksums of its slots.
pub(crate) struct SwapIo {
    backend: Backend,
    csum: Box<[AtomicU64]>,
    pswpin: AtomicU64,
    pswpout: AtomicU64,
    io_errors: AtomicU64,
    checksum_errors: AtomicU64,
}

impl SwapIo {
    pub(crate) fn new(backend: Backend, nr_slots: u32) -> SwapIo {
        SwapIo {
            backend,
            csum: (0..nr_slots).map(|_| AtomicU64::new(0)).collect(),
            pswpin: AtomicU64::new(0),
            pswpout: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            checksum_errors: AtomicU64::new(0),
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    fn io_err(&self, slot: u32, e: io::Error) -> SwapIoError {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
        SwapIoError::Io {
            slot,
            kind: e.kind(),
            msg: e.to_string(),
        }
    }

    /// Writes one page to `slot` (`swap_writepage`).
    pub(crate) fn swap_writepage(&self, slot: u32, page: &[u8]) -> Result<(), SwapIoError> {
        self.swap_writepages(slot, &[page])
    }

    /// Writes `pages` to the contiguous slots from `first` on, in one request
    /// where the device can. On error no slot of the run validates.
    pub(crate) fn swap_writepages(&self, first: u32, pages: &[&[u8]]) -> Result<(), SwapIoError> {
        let mut ok = [false];
        let mut err = None;
        self.swap_writepages_batch(&[(first, pages)], &mut ok, &mut |_, e| {
            err.get_or_insert(e);
        });
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes `runs` (first slot, pages of contiguous slots) together: on an
    /// NBD device every run's requests are in flight before any reply is
    /// waited for, on a file with `io_uring` all runs go in one submission.
    /// `ok[r]` says whether run `r` was written (each slot of a failed run
    /// stays invalid); `fail(r, error)` reports a failed run once. The
    /// caller checked that every run is inside the device.
    pub(crate) fn swap_writepages_batch(
        &self,
        runs: &[(u32, &[&[u8]])],
        ok: &mut [bool],
        fail: &mut dyn FnMut(usize, SwapIoError),
    ) {
        debug_assert_eq!(runs.len(), ok.len());
        let total: usize = runs.iter().map(|r| r.1.len()).sum();
        // On the stack for a reclaim batch; only a larger one allocates.
        let (mut stack, mut heap) = ([0u32; 256], Vec::new());
        let crcs: &mut [u32] = match stack.get_mut(..total) {
            Some(s) => s,
            None => {
                heap.resize(total, 0);
                &mut heap
            }
        };
        let mut at = 0;
        for &(first, pages) in runs {
            for c in &self.csum[first as usize..first as usize + pages.len()] {
                c.store(0, Ordering::Release);
            }
            for p in pages {
                crcs[at] = crc32c::crc32c(p);
                at += 1;
            }
        }
        ok.iter_mut().for_each(|o| *o = true);
        let mut failed = |r: usize, e: io::Error, ok: &mut [bool]| {
            if std::mem::replace(&mut ok[r], false) {
                fail(r, self.io_err(runs[r].0, e));
            }
        };
        match &self.backend {
            Backend::Nbd(d) => d.write_runs(runs, &mut |r, e| failed(r, e, ok)),
            Backend::File(f) => {
                let file_runs: Vec<(u64, &[&[u8]])> =
                    runs.iter().map(|&(s, p)| (s as u64 * PAGE, p)).collect();
                if let Err(e) = f.write_runs(&file_runs) {
                    // One submission: any failure fails every run.
                    let msg = e.to_string();
                    for r in 0..runs.len() {
                        failed(r, io::Error::new(e.kind(), msg.clone()), ok);
                    }
                }
            }
            b => {
                for (r, &(first, pages)) in runs.iter().enumerate() {
                    let off = first as u64 * PAGE;
                    if let Err(e) = pages
                        .iter()
                        .enumerate()
                        .try_for_each(|(i, p)| b.dev().write(off + i as u64 * PAGE, p))
                    {
                        failed(r, e, ok);
                    }
                }
            }
        }
        let mut at = 0;
        for (&(first, pages), &done) in runs.iter().zip(ok.iter()) {
            let range = first as usize..first as usize + pages.len();
            if done {
                for (c, &crc) in self.csum[range].iter().zip(&crcs[at..]) {
                    c.store(CSUM_VALID | crc as u64, Ordering::Release);
                }
                self.pswpout
                    .fetch_add(pages.len() as u64, Ordering::Relaxed);
            }
            at += pages.len();
        }
    }

    /// Reads `slot` into `page` and verifies its checksum (`swap_read_folio`).
    /// On any error `page` holds no data to be trusted.
    pub(crate) fn swap_readpage(&self, slot: u32, page: &mut [u8]) -> Result<(), SwapIoError> {
        assert_eq!(page.len(), PAGE_SIZE);
        // SAFETY: `page` is borrowed mutably until the read ends here.
        let r = unsafe { self.swap_read_start(slot, page.as_mut_ptr(), true)? };
        self.swap_read_end(r, page)
    }

    /// Starts the read of `slot` into the page at `page`: on an NBD device it
    /// is sent and not waited for, on the other devices it is done now. `block`:
    /// an NBD device may wait for a free request slot (else an I/O error of
    /// kind `WouldBlock`, nothing sent: a readahead skips the page).
    /// [`SwapIo::swap_read_end`] waits and verifies.
    ///
    /// # Safety
    /// `page` is valid for writes of 4096 bytes, and nothing else accesses it,
    /// until the read is passed to `swap_read_end`; every read started must be.
    pub(crate) unsafe fn swap_read_start(
        &self,
        slot: u32,
        page: *mut u8,
        block: bool,
    ) -> Result<SwapRead, SwapIoError> {
        let want = self.csum[slot as usize].load(Ordering::Acquire);
        if want & CSUM_VALID == 0 {
            return Err(SwapIoError::NotWritten { slot });
        }
        let off = slot as u64 * PAGE;
        let state = match &self.backend {
            // SAFETY: the caller's contract.
            Backend::Nbd(d) => match unsafe { d.read_submit(off, page, block) } {
                Ok(t) => ReadState::Nbd(t),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(SwapIoError::Io {
                        slot,
                        kind: e.kind(),
                        msg: e.to_string(),
                    })
                }
                Err(e) => return Err(self.io_err(slot, e)),
            },
            b => {
                // SAFETY: the caller's contract: 4096 bytes ours to write.
                let buf = unsafe { std::slice::from_raw_parts_mut(page, PAGE_SIZE) };
                b.dev().read(off, buf).map_err(|e| self.io_err(slot, e))?;
                ReadState::Done
            }
        };
        Ok(SwapRead { slot, want, state })
    }

    /// Waits for a read started by [`SwapIo::swap_read_start`] into `page`
    /// (the same page) and verifies its checksum. On any error `page` holds
    /// no data to be trusted.
    pub(crate) fn swap_read_end(&self, r: SwapRead, page: &[u8]) -> Result<(), SwapIoError> {
        let SwapRead { slot, want, state } = r;
        if let ReadState::Nbd(t) = state {
            let Backend::Nbd(d) = &self.backend else {
                unreachable!("an NBD read on another device");
            };
            d.read_complete(t).map_err(|e| self.io_err(slot, e))?;
        }
        let found = crc32c::crc32c(page);
        if found != want as u32 {
            self.checksum_errors.fetch_add(1, Ordering::Relaxed);
            return Err(SwapIoError::Corrupt {
                slot,
                expected: want as u32,
                found,
            });
        }
        self.pswpin.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets the page of a freed slot (its next read is `NotWritten`).
    pub(crate) fn invalidate(&self, slot: u32) {
        self.csum[slot as usize].store(0, Ordering::Release);
        if let Backend::Nbd(d) = &self.backend {
            d.discard(slot);
        }
    }

    pub(crate) fn stats(&self) -> SwapIoStats {
        SwapIoStats {
            pswpin: self.pswpin.load(Ordering::Relaxed),
            pswpout: self.pswpout.load(Ordering::Relaxed),
            io_errors: self.io_errors.load(Ordering::Relaxed),
            checksum_errors: self.checksum_errors.load(Ordering::Relaxed),
        }
    }
}

mod file;
pub(crate) use file::{DirectIo, FileDevice, IoEngine};

#[cfg(all(test, not(loom)))]
pub(crate) mod tests;
