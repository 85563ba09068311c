//! The std runtime's [`Platform`]: CPU id read from the thread's rseq area (one
//! load; glibc 2.35+ registers rseq for every thread and the kernel keeps `cpu_id`
//! current), falling back to `sched_getcpu` where rseq is not registered; a
//! monotonic clock; yielding while spinning (threads may outnumber CPUs); and a
//! spin-then-park mutex for zone locks.

use mmkit_core::Platform;
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
        if let Some(c) = rseq_cpu_id() {
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
fn rseq_cpu_id() -> Option<usize> {
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
fn rseq_cpu_id() -> Option<usize> {
    None
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
