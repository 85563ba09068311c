//! The arena: the real memory an `Mm` manages, one anonymous mapping.
//!
//! Mapped with `mmap(MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`, aligned to 4 MiB (an
//! order-10 block) so that buddy blocks are naturally aligned in virtual memory and
//! THP can back them, and advised `MADV_HUGEPAGE`. Optionally backed by hugetlb
//! 2 MiB pages (reserving them through /proc/sys/vm/nr_hugepages if needed and
//! allowed), falling back to THP with a message when that is refused. Optionally
//! pre-faulted so that measurements don't include the host's first-touch faults.
//!
//! Invariant: `base` is 4 MiB aligned and `len` bytes from it are mapped read/write
//! until drop.

use std::io;
use std::ptr::NonNull;

const ALIGN: usize = 4 << 20;
const HUGE_2M: usize = 2 << 20;

/// How the arena is backed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory advised for transparent huge pages.
    Thp,
    /// hugetlbfs 2 MiB pages.
    HugeTlb,
}

pub(crate) struct Arena {
    map: NonNull<u8>,
    map_len: usize,
    base: *mut u8,
    len: usize,
    backing: Backing,
    /// Why hugetlb was not used, when it was asked for.
    pub fallback_note: Option<String>,
}

// SAFETY: the arena is plain memory; access to its bytes is arbitrated by the page
// allocator (a caller owns the blocks it allocated).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

fn mmap_anon(len: usize, extra: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p as *mut u8).expect("mmap returned null"))
}

fn try_reserve_hugetlb(pages: usize) -> io::Result<()> {
    let path = "/proc/sys/vm/nr_hugepages";
    let cur: usize = std::fs::read_to_string(path)?.trim().parse().unwrap_or(0);
    let free: usize =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    if free >= pages {
        return Ok(());
    }
    std::fs::write(path, format!("{}", cur + pages - free))
}

impl Arena {
    pub(crate) fn new(len: usize, hugetlb: bool, prefault: bool) -> io::Result<Arena> {
        let mut note = None;
        if hugetlb {
            let huge_len = len.div_ceil(HUGE_2M) * HUGE_2M + ALIGN;
            let attempt = mmap_anon(huge_len, libc::MAP_HUGETLB).or_else(|_| {
                try_reserve_hugetlb(huge_len / HUGE_2M)?;
                mmap_anon(huge_len, libc::MAP_HUGETLB)
            });
            match attempt {
                Ok(map) => {
                    let mut a = Arena::place(map, huge_len, len, Backing::HugeTlb);
                    if prefault {
                        a.prefault();
                    }
                    return Ok(a);
                }
                Err(e) => {
                    let msg = format!("hugetlb backing refused ({e}); falling back to THP");
                    eprintln!("mmkit: {msg}");
                    note = Some(msg);
                }
            }
        }
        let map_len = len + ALIGN;
        let map = mmap_anon(map_len, 0)?;
        let mut a = Arena::place(map, map_len, len, Backing::Thp);
        a.fallback_note = note;
        // SAFETY: [base, base+len) lies inside the mapping just created.
        unsafe {
            libc::madvise(a.base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        if prefault {
            a.prefault();
        }
        Ok(a)
    }

    fn place(map: NonNull<u8>, map_len: usize, len: usize, backing: Backing) -> Arena {
        let addr = map.as_ptr() as usize;
        let base = (addr + ALIGN - 1) & !(ALIGN - 1);
        Arena {
            map,
            map_len,
            base: base as *mut u8,
            len,
            backing,
            fallback_note: None,
        }
    }

    fn prefault(&mut self) {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range is inside our mapping; MADV_POPULATE_WRITE only faults it in.
        let r = unsafe {
            libc::madvise(
                self.base as *mut libc::c_void,
                self.len,
                MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            // Older kernels: touch one byte per 4 KiB page.
            let mut off = 0;
            while off < self.len {
                // SAFETY: off < len, inside the mapping; volatile keeps the store.
                unsafe { std::ptr::write_volatile(self.base.add(off), 0) };
                off += 4096;
            }
        }
    }

    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn backing(&self) -> Backing {
        self.backing.clone()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping this arena created; no references
        // into it outlive the Mm that owns it.
        unsafe {
            libc::munmap(self.map.as_ptr() as *mut libc::c_void, self.map_len);
        }
    }
}
