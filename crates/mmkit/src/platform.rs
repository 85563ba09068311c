//! The std runtime's [`Platform`]: CPU id read from the thread's rseq area (one
//! load; glibc 2.35+ registers rseq for every thread and the kernel keeps `cpu_id`
//! current), falling back to `sched_getcpu` where rseq is not registered; a
//! monotonic clock; yielding while spinning (threads may outnumber CPUs); a
//! spin-then-park mutex for zone locks; and the per-CPU page caches' operations
//! (`mmkit_core::pcp_cache`), which are the restartable sequences of `rseq.rs`.
//!
//! No state but the clock's epoch (set once); no lock.

use mmkit_core::pcp_cache::PcpCacheList;
use mmkit_core::Platform;

use crate::rseq;
use std::sync::OnceLock;
use std::time::Instant;

/// The platform the std runtime plugs into the core.
pub struct StdPlatform;

fn epoch() -> &'static Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now)
}

impl Platform for StdPlatform {
    type ZoneLock = parking_lot::RawMutex;

    #[inline]
    fn cpu_id() -> usize {
        if let Some(c) = rseq::cpu_id() {
            return c;
        }
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let c = unsafe { libc::sched_getcpu() };
        if c < 0 {
            0
        } else {
            c as usize
        }
    }

    fn now_ns() -> u64 {
        epoch().elapsed().as_nanos() as u64
    }

    fn relax() {
        std::thread::yield_now()
    }

    fn cache_ops_available() -> bool {
        rseq::available()
    }

    #[inline]
    unsafe fn cache_pop(row: *const PcpCacheList, nr: usize) -> Option<u32> {
        // SAFETY: forwarded from the caller.
        unsafe { rseq::pop(row, nr) }
    }

    #[inline]
    unsafe fn cache_push(row: *const PcpCacheList, nr: usize, idx: u32) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { rseq::push(row, nr, idx) }
    }

    #[inline]
    unsafe fn cache_pop_many(row: *const PcpCacheList, nr: usize, out: &mut [u32]) -> usize {
        // SAFETY: forwarded from the caller.
        unsafe { rseq::pop_many(row, nr, out) }
    }

    #[inline]
    unsafe fn cache_push_many(row: *const PcpCacheList, nr: usize, src: &[u32]) -> usize {
        // SAFETY: forwarded from the caller.
        unsafe { rseq::push_many(row, nr, src) }
    }

    fn cache_fence() {
        rseq::fence()
    }
}

/// Number of CPUs the system may bring online (per-CPU slots to allocate).
pub fn nr_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_id_agrees_with_sched_getcpu() {
        // Pin a thread to each CPU in turn so the readings cannot differ by a migration.
        for cpu in 0..nr_cpus().min(8) {
            std::thread::spawn(move || {
                // SAFETY: plain libc calls on a zeroed cpu_set_t.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return;
                    }
                    std::thread::yield_now();
                    assert_eq!(StdPlatform::cpu_id(), cpu);
                    assert_eq!(libc::sched_getcpu() as usize, cpu);
                }
            })
            .join()
            .unwrap();
        }
    }
}
