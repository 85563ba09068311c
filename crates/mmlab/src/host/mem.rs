//! Host memory of this process, for the kernel sides of the address-space
//! workloads: anonymous mappings (buffers for the raw loops, set up outside the
//! measured loops), the transparent huge page share of a mapping from
//! /proc/self/smaps, and 2 MiB hugetlb pages reserved through
//! /proc/sys/vm/nr_hugepages.
//!
//! The kernel variants of the workloads call `libc::mmap`/`munmap` themselves, so
//! that their measured loops are exactly what a C program runs; `HostMap` is for
//! memory that is set up outside them. Invariant: a `HostMap` owns its whole
//! mapping and unmaps it on drop; a `HugetlbReservation` writes the old
//! `nr_hugepages` back on drop.

use std::io;
use std::ptr::NonNull;

/// 4 KiB.
pub const PAGE: usize = 4096;
/// A PMD-mapped huge page, 2 MiB.
pub const HUGE: usize = 2 << 20;
/// `MAP_HUGE_2MB` (21 << MAP_HUGE_SHIFT), which libc exports only for some
/// targets.
pub const MAP_HUGE_2MB: libc::c_int = 21 << 26;

/// An anonymous private mapping of this process, unmapped on drop. The usable
/// range `[ptr, ptr + len)` may lie inside a larger mapping (for alignment).
pub struct HostMap {
    map: NonNull<u8>,
    map_len: usize,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; whoever holds it (or a
// pointer derived from it) arbitrates access, as with a Vec's buffer.
unsafe impl Send for HostMap {}
// SAFETY: as above: shared references hand out only the address.
unsafe impl Sync for HostMap {}

/// `mmap(NULL, len, RW, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0)`.
pub fn mmap_anon(len: usize, extra: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no
    // existing memory; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

impl HostMap {
    /// `len` bytes (a multiple of 2 MiB) at a 2 MiB-aligned address, advised
    /// `MADV_HUGEPAGE`, and, with `prefault`, written once per 4 KiB so that every
    /// page is present (as mmkit's prefaulted arena is: transparent huge pages
    /// where the host gives them). The advised range is its own VMA: at least a
    /// page of unadvised mapping lies on each side of it, so it never merges with
    /// a neighbour and /proc/self/smaps shows it alone.
    pub fn huge_aligned(len: usize, prefault: bool) -> io::Result<HostMap> {
        let map_len = len + 2 * HUGE;
        let map = mmap_anon(map_len, 0)?;
        // At least one page in, at most 2 MiB in: the tail keeps 2 MiB.
        let head = map.as_ptr().wrapping_add(PAGE);
        let ptr = head.wrapping_add(head.align_offset(HUGE));
        let m = HostMap {
            map,
            map_len,
            ptr,
            len,
        };
        // SAFETY: [ptr, ptr + len) lies inside the mapping (ptr is at most 2 MiB
        // past its start and the mapping is len + 4 MiB long). Advice only.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        if prefault {
            m.prefault();
        }
        Ok(m)
    }

    /// Writes one byte per 4 KiB page, so that every page is present.
    pub fn prefault(&self) {
        for off in (0..self.len).step_by(PAGE) {
            // SAFETY: off < len, inside the usable range, which this value owns.
            unsafe { self.ptr.add(off).write_volatile(0) };
        }
    }

    /// Start of the usable range.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the usable range in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `huge_aligned`; every pointer
        // derived from it is gone with the borrow of `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

/// `AnonHugePages` (bytes) of the mapping of this process that starts at `addr`,
/// from /proc/self/smaps; `None` if it cannot be read or no mapping starts there.
pub fn anon_huge_bytes(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    anon_huge_in_smaps(&smaps, addr)
}

/// The parser of `anon_huge_bytes`.
fn anon_huge_in_smaps(smaps: &str, addr: usize) -> Option<u64> {
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, _end)) = first.split_once('-') {
            if start.chars().all(|c| c.is_ascii_hexdigit()) && !start.is_empty() {
                inside = usize::from_str_radix(start, 16).ok() == Some(addr);
                continue;
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kb * 1024);
            }
        }
    }
    None
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

fn read_usize(path: &str) -> io::Result<usize> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

/// 2 MiB hugetlb pages reserved for a measurement: `nr_hugepages` raised so that
/// enough are free; the old value is written back on drop.
pub struct HugetlbReservation {
    old: Option<usize>,
}

impl HugetlbReservation {
    /// Makes at least `pages` 2 MiB hugetlb pages free (raising
    /// /proc/sys/vm/nr_hugepages, which needs root). Err says why not; then
    /// nothing is left changed.
    pub fn reserve(pages: usize) -> Result<HugetlbReservation, String> {
        let free = read_usize(FREE_HUGEPAGES).map_err(|e| format!("{FREE_HUGEPAGES}: {e}"))?;
        if free >= pages {
            return Ok(HugetlbReservation { old: None });
        }
        let old = read_usize(NR_HUGEPAGES).map_err(|e| format!("{NR_HUGEPAGES}: {e}"))?;
        let r = HugetlbReservation { old: Some(old) };
        std::fs::write(NR_HUGEPAGES, format!("{}", old + pages - free))
            .map_err(|e| format!("writing {NR_HUGEPAGES}: {e}"))?;
        let now = read_usize(FREE_HUGEPAGES).unwrap_or(0);
        if now < pages {
            // `r` drops here and restores the old value.
            return Err(format!(
                "the kernel gave {now} free 2 MiB hugetlb pages of {pages} asked"
            ));
        }
        Ok(r)
    }
}

impl Drop for HugetlbReservation {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = std::fs::write(NR_HUGEPAGES, format!("{old}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_parser_finds_the_mapping() {
        let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      2048 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Size:               2048 kB
AnonHugePages:         0 kB
";
        assert_eq!(anon_huge_in_smaps(smaps, 0x7f00_0000_0000), Some(2 << 20));
        assert_eq!(anon_huge_in_smaps(smaps, 0x7f00_0040_0000), Some(0));
        assert_eq!(anon_huge_in_smaps(smaps, 0x1234), None);
    }

    #[test]
    fn huge_aligned_map_is_aligned_and_writable() {
        let m = HostMap::huge_aligned(4 << 20, true).unwrap();
        assert_eq!(m.ptr() as usize % HUGE, 0);
        assert_eq!(m.bytes(), 4 << 20);
        // SAFETY: inside the usable range.
        unsafe { m.ptr().add(m.bytes() - 1).write(7) };
        assert!(m.ptr() as usize >= m.map.as_ptr() as usize + PAGE);
        assert!(anon_huge_bytes(m.ptr() as usize).is_some());
    }
}
