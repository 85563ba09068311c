//! The swap file device (`FileDevice`): a real file, opened with `O_DIRECT`
//! where the filesystem takes it (buffered I/O otherwise, e.g. an old tmpfs),
//! through `io_uring` where the kernel offers it (`pread`/`pwrite`
//! otherwise), both detected at open. Runs of contiguous slots are written
//! with one request each, all runs of a batch in one submission.
//!
//! Invariants: offsets and lengths are multiples of 4096 inside the file;
//! with `O_DIRECT`, every buffer handed to the kernel is page-aligned (a
//! caller's unaligned buffer goes through an `AlignedBuf`).
//!
//! Locking: a few `io_uring` rings, each behind a mutex held for one
//! submission and its completions; the file itself needs none (the swap
//! map gives a slot one writer and no reader meanwhile).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use mmkit_core::{Platform, PAGE_SIZE};
use parking_lot::Mutex;

use super::{check_range, cvt, retry_eintr, SwapBackend, PAGE};
use crate::platform::StdPlatform;

/// A page-aligned heap buffer (what `O_DIRECT` needs).
struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), PAGE_SIZE).unwrap();
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        AlignedBuf {
            ptr: NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout)),
            len,
        }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialized bytes owned by self, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), PAGE_SIZE).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Whether a file device may use `O_DIRECT`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum DirectIo {
    /// Where the filesystem accepts it (probed at open).
    Auto,
    /// Buffered I/O.
    Never,
}

/// How a file device submits its I/O.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum IoEngine {
    /// `io_uring` where the kernel offers it, else `pread`/`pwrite`.
    Auto,
    /// `pread`/`pwrite`.
    Sync,
}

const NR_RINGS: usize = 4;
const RING_ENTRIES: u32 = 64;

/// A swap file.
pub(crate) struct FileDevice {
    file: File,
    size: u64,
    direct: bool,
    rings: Option<Box<[Mutex<io_uring::IoUring>]>>,
}

fn open_file(path: &std::path::Path, direct: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

fn uring_rings() -> Option<Box<[Mutex<io_uring::IoUring>]>> {
    let mut rings = Vec::with_capacity(NR_RINGS);
    for _ in 0..NR_RINGS {
        let ring = io_uring::IoUring::new(RING_ENTRIES).ok()?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe).ok()?;
        if !probe.is_supported(io_uring::opcode::Read::CODE)
            || !probe.is_supported(io_uring::opcode::Write::CODE)
        {
            return None;
        }
        rings.push(Mutex::new(ring));
    }
    Some(rings.into_boxed_slice())
}

impl FileDevice {
    /// Opens (creating it if missing) the file at `path` and sizes it to `size`
    /// bytes (blocks are allocated up front where the filesystem can). The caller
    /// validated the path (a regular file or nothing) and the size.
    pub(crate) fn open(
        path: &std::path::Path,
        size: u64,
        direct: DirectIo,
        engine: IoEngine,
    ) -> io::Result<FileDevice> {
        check_range(0, size as usize, size)?;
        let mut file = None;
        let mut is_direct = false;
        if direct == DirectIo::Auto {
            // Some filesystems refuse O_DIRECT at open, others at the first I/O.
            if let Ok(f) = open_file(path, true) {
                let mut probe = AlignedBuf::new(PAGE_SIZE);
                if f.metadata()?.len() < PAGE {
                    f.set_len(size)?;
                }
                if pread_all(&f, 0, probe.as_mut()).is_ok() {
                    file = Some(f);
                    is_direct = true;
                }
            }
        }
        let file = match file {
            Some(f) => f,
            None => open_file(path, false)?,
        };
        // SAFETY: plain syscall on an fd we own.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
        if r == libc::ENOSPC {
            return Err(io::Error::from_raw_os_error(r));
        }
        file.set_len(size)?;
        let rings = if engine == IoEngine::Auto {
            uring_rings()
        } else {
            None
        };
        Ok(FileDevice {
            file,
            size,
            direct: is_direct,
            rings,
        })
    }

    /// True when the file was opened with `O_DIRECT`.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// True when I/O goes through `io_uring`.
    pub(crate) fn uses_io_uring(&self) -> bool {
        self.rings.is_some()
    }

    fn ring(&self) -> Option<&Mutex<io_uring::IoUring>> {
        let r = self.rings.as_ref()?;
        Some(&r[StdPlatform::cpu_id() % r.len()])
    }

    /// Submits `ios` (offset, pointer, length, is_write) on one ring and waits
    /// for all of them; each must transfer its whole length.
    fn uring_io(
        ring: &Mutex<io_uring::IoUring>,
        fd: i32,
        ios: &[(u64, *mut u8, usize, bool)],
    ) -> io::Result<()> {
        let mut ring = ring.lock();
        for chunk in ios.chunks(RING_ENTRIES as usize) {
            for (i, &(off, ptr, len, write)) in chunk.iter().enumerate() {
                let e = if write {
                    io_uring::opcode::Write::new(io_uring::types::Fd(fd), ptr, len as u32)
                        .offset(off)
                        .build()
                } else {
                    io_uring::opcode::Read::new(io_uring::types::Fd(fd), ptr, len as u32)
                        .offset(off)
                        .build()
                };
                // SAFETY: the buffers outlive the call (we wait for every completion
                // below before returning), and the ring has room for a chunk.
                unsafe { ring.submission().push(&e.user_data(i as u64)) }
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
            let mut done = 0;
            let mut err = None;
            while done < chunk.len() {
                retry_eintr(|| ring.submit_and_wait(chunk.len() - done))?;
                for cqe in ring.completion() {
                    done += 1;
                    let want = chunk[cqe.user_data() as usize].2;
                    if cqe.result() < 0 {
                        err.get_or_insert(io::Error::from_raw_os_error(-cqe.result()));
                    } else if cqe.result() as usize != want {
                        err.get_or_insert(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "short swap I/O",
                        ));
                    }
                }
            }
            if let Some(e) = err {
                return Err(e);
            }
        }
        Ok(())
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.ring() {
            Some(r) => Self::uring_io(
                r,
                self.file.as_raw_fd(),
                &[(offset, buf.as_mut_ptr(), buf.len(), false)],
            ),
            None => pread_all(&self.file, offset, buf),
        }
    }

    /// Writes runs of contiguous pages: `runs` holds (offset, pages of the run).
    /// Each run goes out as one request; with `io_uring` all runs are in flight
    /// together.
    pub(crate) fn write_runs(&self, runs: &[(u64, &[&[u8]])]) -> io::Result<()> {
        let mut bufs = Vec::with_capacity(runs.len());
        for &(off, pages) in runs {
            let len: usize = pages.iter().map(|p| p.len()).sum();
            check_range(off, len, self.size)?;
            let mut b = AlignedBuf::new(len);
            let mut at = 0;
            for p in pages {
                b.as_mut()[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            bufs.push((off, b));
        }
        match self.ring() {
            Some(r) => {
                let ios: Vec<_> = bufs
                    .iter_mut()
                    .map(|(off, b)| (*off, b.as_mut().as_mut_ptr(), b.len, true))
                    .collect();
                Self::uring_io(r, self.file.as_raw_fd(), &ios)
            }
            None => bufs
                .iter()
                .try_for_each(|(off, b)| pwrite_all(&self.file, *off, b.as_ref())),
        }
    }
}

/// Runs `op(done, offset)` (one `pread`/`pwrite` of the rest from `done` bytes
/// on) until `len` bytes moved, retrying on `EINTR` and short transfers.
fn io_all(len: usize, off: u64, mut op: impl FnMut(usize, u64) -> isize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = retry_eintr(|| cvt(op(done, off + done as u64)))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "swap file too short",
            ));
        }
        done += n;
    }
    Ok(())
}

fn pread_all(f: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    let (fd, len, p) = (f.as_raw_fd(), buf.len(), buf.as_mut_ptr());
    io_all(len, off, |done, at| {
        // SAFETY: `p + done .. p + len` lies inside `buf`, valid for writes.
        unsafe { libc::pread(fd, p.add(done).cast(), len - done, at as libc::off_t) }
    })
}

fn pwrite_all(f: &File, off: u64, buf: &[u8]) -> io::Result<()> {
    let (fd, len, p) = (f.as_raw_fd(), buf.len(), buf.as_ptr());
    io_all(len, off, |done, at| {
        // SAFETY: `p + done .. p + len` lies inside `buf`, valid for reads.
        unsafe { libc::pwrite(fd, p.add(done).cast(), len - done, at as libc::off_t) }
    })
}

impl SwapBackend for FileDevice {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        if self.direct && !(buf.as_ptr() as usize).is_multiple_of(PAGE_SIZE) {
            let mut b = AlignedBuf::new(buf.len());
            self.read_aligned(offset, b.as_mut())?;
            buf.copy_from_slice(b.as_ref());
            return Ok(());
        }
        self.read_aligned(offset, buf)
    }

    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if !self.direct && self.rings.is_none() {
            check_range(offset, buf.len(), self.size)?;
            return pwrite_all(&self.file, offset, buf);
        }
        self.write_runs(&[(offset, &[buf])])
    }
}
