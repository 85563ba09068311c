//! The per-CPU page caches' restartable sequences (`mmkit_core::pcp_cache`):
//! x86-64 assembly that commits with one store, registered with the kernel through
//! the thread's rseq area, and `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`
//! as the remote fence; also the current CPU read from that area. Elsewhere (not
//! Linux x86-64 with glibc) the caches are unavailable and every operation misses.
//!
//! Restartable sequences (Linux's rseq ABI): before entering, a thread stores the
//! address of a `struct rseq_cs` descriptor (start, length, abort address) in
//! its rseq area's `rseq_cs` field. If the kernel preempts, migrates or signals
//! the thread while its instruction pointer is inside [start, start + length), it
//! resumes it at the abort address instead, whose 4 preceding bytes must be the
//! signature glibc registered (`RSEQ_SIG`, 0x53053053 on x86). Everything before the
//! last instruction (the commit) is therefore done again or not at all.
//!
//! Invariants: a sequence's only store visible to others is its last instruction
//! (the commit); a fenced list or a CPU without a list misses. Locking: none; the
//! per-CPU list is the current CPU's, and the fence (membarrier) restarts every
//! sequence in flight, which is what lets a drain take a list over.

use mmkit_core::pcp_cache::PcpCacheList;

pub(crate) use imp::{available, fence, pop, pop_many, push, push_many};

/// Restartable sequences aborted (and retried) so far, in this process: the
/// kernel preempted, migrated or signalled a thread inside one.
pub fn rseq_aborts() -> u64 {
    imp::ABORTS.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
extern "C" {
    // glibc 2.35+: offset of the thread's `struct rseq` from the thread pointer,
    // and its size (0 when rseq registration is disabled or failed).
    static __rseq_offset: isize;
    static __rseq_size: u32;
}

/// The current CPU from the rseq area, or None when rseq is not registered.
#[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
#[inline]
pub(crate) fn cpu_id() -> Option<usize> {
    // SAFETY: reading two constants glibc exports and initialises before main.
    let (off, size) = unsafe { (__rseq_offset, __rseq_size) };
    if size == 0 {
        return None;
    }
    let tp: usize;
    // SAFETY: on x86_64 Linux, %fs:0 holds the thread pointer (the TCB points to itself).
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    // struct rseq { u32 cpu_id_start; u32 cpu_id; ... }: cpu_id is at offset 4.
    let p = (tp as isize + off + 4) as *const i32;
    // SAFETY: glibc registered this thread's rseq area at tp + __rseq_offset (size > 0);
    // the kernel updates cpu_id, so read it volatile.
    let c = unsafe { std::ptr::read_volatile(p) };
    (c >= 0).then_some(c as usize)
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu")))]
#[inline]
pub(crate) fn cpu_id() -> Option<usize> {
    None
}

#[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
mod imp {
    use super::{__rseq_offset, __rseq_size, PcpCacheList};
    use mmkit_core::pcp_cache::{
        PCP_CACHE_FENCED, PCP_CACHE_LIST_SHIFT, PCP_CACHE_POPS, PCP_CACHE_PUSHES, PCP_CACHE_SLOTS,
        PCP_CACHE_SLOTS_OFF,
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    pub(crate) static ABORTS: AtomicU64 = AtomicU64::new(0);

    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 8;
    /// `struct rseq` up to and including `rseq_cs` (`cpu_id_start`, `cpu_id`, `rseq_cs`).
    const RSEQ_MIN_SIZE: u32 = 16;
    /// Offset of `cpu_id` and of `rseq_cs` in `struct rseq`.
    const RSEQ_CPU_ID: usize = 4;
    const RSEQ_CS: usize = 8;

    /// rseq is registered for this process's threads and membarrier's rseq fence
    /// could be registered: checked once.
    pub(crate) fn available() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            // SAFETY: reading a constant glibc exports and initialises before main.
            if unsafe { __rseq_size } < RSEQ_MIN_SIZE {
                return false;
            }
            // SAFETY: membarrier with a register command and no flags has no
            // memory arguments.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
                    0,
                    0,
                )
            };
            r == 0
        })
    }

    /// The offset of the calling thread's `struct rseq` from its thread
    /// pointer (the `%fs` base): the sequences address the area `%fs`-relative,
    /// so they never materialise the thread pointer.
    #[inline(always)]
    fn area() -> isize {
        // SAFETY: a constant glibc initialises before main.
        unsafe { __rseq_offset }
    }

    const HIT: u32 = 0;
    const MISS: u32 = 1;
    const ABORT: u32 = 2;

    /// One restartable sequence on the current CPU's list of a row (`$rs`: the
    /// rseq area's offset from the `%fs` base, see `area`): `$body` runs
    /// with `{c}` pointing at the list (CPU in range, list not fenced), jumps to
    /// `24f` to miss, and ends with its commit store. Sets `{s}` to HIT, MISS or
    /// ABORT. The descriptor (start 21, length to 22, abort 23) goes to `__rseq_cs`,
    /// the signature right before the abort label.
    macro_rules! rseq_sequence {
        ($rs:expr, $row:expr, $nr:expr, $status:ident, $($body:literal),+ ; $($ops:tt)*) => {
            std::arch::asm!(
                "lea {t}, [rip + 20f]",
                "mov qword ptr fs:[{rs} + {cs}], {t}",
                "21:",
                "mov {c:e}, dword ptr fs:[{rs} + {cpu}]",
                "cmp {c}, {nr}",
                "jae 24f",
                "shl {c}, {shift}",
                "add {c}, {row}",
                "cmp dword ptr [{c} + {fenced}], 0",
                "jne 24f",
                $($body),+,
                "22:",
                "xor {s:e}, {s:e}",
                "jmp 25f",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "23:",
                "mov {s:e}, {abort}",
                "jmp 25f",
                "24:",
                "mov {s:e}, {miss}",
                "25:",
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "20:",
                ".long 0, 0",
                ".quad 21b, 22b - 21b, 23b",
                ".popsection",
                rs = in(reg) $rs,
                row = in(reg) $row,
                nr = in(reg) $nr,
                t = out(reg) _,
                c = out(reg) _,
                s = out(reg) $status,
                cs = const RSEQ_CS,
                cpu = const RSEQ_CPU_ID,
                shift = const PCP_CACHE_LIST_SHIFT,
                fenced = const PCP_CACHE_FENCED,
                pops = const PCP_CACHE_POPS,
                pushes = const PCP_CACHE_PUSHES,
                slots = const PCP_CACHE_SLOTS,
                slot0 = const PCP_CACHE_SLOTS_OFF,
                abort = const ABORT,
                miss = const MISS,
                $($ops)*
                options(nostack),
            )
        };
    }

    /// Runs `seq` (one restartable sequence: its status and its value) until it
    /// commits or misses, counting the aborts; `miss` is the result of a miss.
    #[inline(always)]
    fn until_done<T>(miss: T, mut seq: impl FnMut() -> (u32, T)) -> T {
        loop {
            match seq() {
                (HIT, v) => return v,
                (MISS, _) => return miss,
                _ => {
                    ABORTS.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// See `Platform::cache_pop`.
    #[inline]
    pub(crate) unsafe fn pop(row: *const PcpCacheList, nr: usize) -> Option<u32> {
        let rs = area();
        until_done(None, || {
            let status: u32;
            let val: u32;
            // SAFETY: `%fs:rs` is this thread's registered rseq area (`available()` was
            // true before any cache existed); `row` holds `nr` lists (caller). The
            // sequence only reads until its last instruction, the store of
            // `pops + 1`, which commits it.
            unsafe {
                rseq_sequence!(rs, row, nr, status,
                    "mov {p:e}, dword ptr [{c} + {pops}]",
                    "mov {t:e}, dword ptr [{c} + {pushes}]",
                    "sub {t:e}, {p:e}",
                    "jz 24f",
                    "cmp {t:e}, {slots}",
                    "ja 24f",
                    "mov {v:e}, dword ptr [{c} + {t} * 4 + {slot0} - 4]",
                    "inc {p:e}",
                    "mov dword ptr [{c} + {pops}], {p:e}";
                    p = out(reg) _,
                    v = out(reg) val,
                );
            }
            (status, Some(val))
        })
    }

    /// See `Platform::cache_push`.
    #[inline]
    pub(crate) unsafe fn push(row: *const PcpCacheList, nr: usize, idx: u32) -> bool {
        let rs = area();
        until_done(false, || {
            let status: u32;
            // SAFETY: as in `pop`. The slot store before the commit writes past the
            // stack's top, which no one reads until the commit makes it part of it.
            unsafe {
                rseq_sequence!(rs, row, nr, status,
                    "mov {q:e}, dword ptr [{c} + {pushes}]",
                    "mov {t:e}, {q:e}",
                    "sub {t:e}, dword ptr [{c} + {pops}]",
                    "cmp {t:e}, {slots}",
                    "jae 24f",
                    "mov dword ptr [{c} + {t} * 4 + {slot0}], {v:e}",
                    "inc {q:e}",
                    "mov dword ptr [{c} + {pushes}], {q:e}";
                    q = out(reg) _,
                    v = in(reg) idx,
                );
            }
            (status, true)
        })
    }

    /// See `Platform::cache_pop_many`: up to `out.len()` entries, top first, in one
    /// sequence.
    #[inline]
    pub(crate) unsafe fn pop_many(row: *const PcpCacheList, nr: usize, out: &mut [u32]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let rs = area();
        until_done(0, || {
            let status: u32;
            let n: usize;
            // SAFETY: as in `pop`; the loop writes at most `min(len, out.len())`
            // entries to `out` (uncommitted: a restart writes them again), then
            // commits by storing `pops + n`.
            unsafe {
                rseq_sequence!(rs, row, nr, status,
                    "mov {p:e}, dword ptr [{c} + {pops}]",
                    "mov {t:e}, dword ptr [{c} + {pushes}]",
                    "sub {t:e}, {p:e}",
                    "jz 24f",
                    "cmp {t:e}, {slots}",
                    "ja 24f",
                    "cmp {t:e}, {m:e}",
                    "cmovb {m:e}, {t:e}",
                    "mov {k:e}, {m:e}",
                    "26:",
                    "mov {v:e}, dword ptr [{c} + {t} * 4 + {slot0} - 4]",
                    "mov dword ptr [{o}], {v:e}",
                    "add {o}, 4",
                    "dec {t:e}",
                    "dec {k:e}",
                    "jnz 26b",
                    "add {p:e}, {m:e}",
                    "mov dword ptr [{c} + {pops}], {p:e}";
                    o = inout(reg) out.as_mut_ptr() => _,
                    // A 32-bit write zero-extends: `n` is the count.
                    m = inout(reg) out.len().min(PCP_CACHE_SLOTS) => n,
                    p = out(reg) _,
                    k = out(reg) _,
                    v = out(reg) _,
                );
            }
            (status, n)
        })
    }

    /// See `Platform::cache_push_many`: as many of `src` as fit, `src[0]` first,
    /// in one sequence.
    #[inline]
    pub(crate) unsafe fn push_many(row: *const PcpCacheList, nr: usize, src: &[u32]) -> usize {
        if src.is_empty() {
            return 0;
        }
        let rs = area();
        until_done(0, || {
            let status: u32;
            let n: usize;
            // SAFETY: as in `push`: the slot stores go past the stack's top, which
            // no one reads until the final store of `pushes + n` commits them.
            unsafe {
                rseq_sequence!(rs, row, nr, status,
                    "mov {q:e}, dword ptr [{c} + {pushes}]",
                    "mov {t:e}, {q:e}",
                    "sub {t:e}, dword ptr [{c} + {pops}]",
                    "mov {k:e}, {slots}",
                    "sub {k:e}, {t:e}",
                    "jbe 24f",
                    "cmp {k:e}, {m:e}",
                    "cmova {k:e}, {m:e}",
                    "mov {m:e}, {k:e}",
                    "27:",
                    "mov {v:e}, dword ptr [{o}]",
                    "mov dword ptr [{c} + {t} * 4 + {slot0}], {v:e}",
                    "add {o}, 4",
                    "inc {t:e}",
                    "dec {k:e}",
                    "jnz 27b",
                    "add {q:e}, {m:e}",
                    "mov dword ptr [{c} + {pushes}], {q:e}";
                    o = inout(reg) src.as_ptr() => _,
                    m = inout(reg) src.len().min(PCP_CACHE_SLOTS) => n,
                    q = out(reg) _,
                    k = out(reg) _,
                    v = out(reg) _,
                );
            }
            (status, n)
        })
    }

    /// Restarts every sequence in flight in this process (see `Platform::cache_fence`).
    pub(crate) fn fence() {
        loop {
            // SAFETY: membarrier with no flags has no memory arguments.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
                    0,
                    0,
                )
            };
            if r == 0 {
                return;
            }
            // Registered at start, so only a transient failure (ENOMEM for the
            // CPU mask) is possible: the fence is what makes the drain safe, so retry.
            std::thread::yield_now();
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu")))]
mod imp {
    use super::PcpCacheList;
    pub(crate) static ABORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    pub(crate) fn available() -> bool {
        false
    }
    pub(crate) unsafe fn pop(_: *const PcpCacheList, _: usize) -> Option<u32> {
        None
    }
    pub(crate) unsafe fn push(_: *const PcpCacheList, _: usize, _: u32) -> bool {
        false
    }
    pub(crate) unsafe fn pop_many(_: *const PcpCacheList, _: usize, _: &mut [u32]) -> usize {
        0
    }
    pub(crate) unsafe fn push_many(_: *const PcpCacheList, _: usize, _: &[u32]) -> usize {
        0
    }
    pub(crate) fn fence() {}
}

#[cfg(test)]
mod tests {
    use crate::StdPlatform;
    use mmkit_core::pcp_cache::{PcpCacheTable, PCP_CACHE_SLOTS};
    use mmkit_core::Platform;

    /// Pins the calling thread to `cpu`; false if not allowed.
    fn pin(cpu: usize) -> bool {
        // SAFETY: plain libc calls on a zeroed cpu_set_t.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }

    /// The restartable operations against the layout: LIFO order, capacity,
    /// partial batches, misses on a fenced list and on a CPU without a list.
    #[test]
    fn restartable_cache_ops_follow_the_layout() {
        if !StdPlatform::cache_ops_available() {
            eprintln!("rseq or membarrier not available here: skipped");
            return;
        }
        std::thread::spawn(|| {
            assert!(pin(0));
            std::thread::yield_now();
            let t = PcpCacheTable::new(1, 1);
            let row = t.row(0, 0);
            let src: Vec<u32> = (100..100 + PCP_CACHE_SLOTS as u32 + 10).collect();
            // SAFETY: `row` is the table's one list for CPU 0, which outlives the calls.
            unsafe {
                assert!(StdPlatform::cache_push(row, 1, 7));
                assert_eq!(StdPlatform::cache_pop(row, 1), Some(7));
                assert_eq!(StdPlatform::cache_pop(row, 1), None);
                assert_eq!(StdPlatform::cache_push_many(row, 1, &src[..20]), 20);
                // Only the room left is taken.
                assert_eq!(
                    StdPlatform::cache_push_many(row, 1, &src[20..]),
                    PCP_CACHE_SLOTS - 20
                );
                assert!(!StdPlatform::cache_push(row, 1, 1));
                assert_eq!(t.lists()[0].len() as usize, PCP_CACHE_SLOTS);
                assert_eq!(
                    StdPlatform::cache_pop(row, 1),
                    Some(src[PCP_CACHE_SLOTS - 1])
                );
                let mut out = [0u32; 5];
                assert_eq!(StdPlatform::cache_pop_many(row, 1, &mut out), 5);
                let want: Vec<u32> = (0..5).map(|i| src[PCP_CACHE_SLOTS - 2 - i]).collect();
                assert_eq!(out.to_vec(), want);
                // A fenced list misses both ways and keeps its entries.
                t.lists()[0]
                    .fenced
                    .store(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(StdPlatform::cache_pop(row, 1), None);
                assert_eq!(StdPlatform::cache_pop_many(row, 1, &mut out), 0);
                assert_eq!(StdPlatform::cache_push_many(row, 1, &src[..1]), 0);
                t.lists()[0]
                    .fenced
                    .store(0, std::sync::atomic::Ordering::SeqCst);
                let mut all = vec![0u32; 2 * PCP_CACHE_SLOTS];
                let n = StdPlatform::cache_pop_many(row, 1, &mut all);
                assert_eq!(n, PCP_CACHE_SLOTS - 6);
                assert_eq!(all[n - 1], src[0]);
                assert_eq!(StdPlatform::cache_pop_many(row, 1, &mut all), 0);
                // A CPU with no list (row of 0 lists) always misses.
                assert!(!StdPlatform::cache_push(row, 0, 1));
                assert_eq!(StdPlatform::cache_pop(row, 0), None);
            }
            let l = &t.lists()[0];
            assert_eq!(
                l.pops.load(std::sync::atomic::Ordering::Relaxed),
                1 + 1 + 5 + (PCP_CACHE_SLOTS as u32 - 6)
            );
            assert_eq!(
                l.pushes.load(std::sync::atomic::Ordering::Relaxed),
                1 + PCP_CACHE_SLOTS as u32
            );
        })
        .join()
        .unwrap();
    }
}
