//! CPU placement of the lab's measuring threads: the CPUs this process may run
//! on (`sched_getaffinity`), and pinning the calling thread to one CPU or a set
//! of them (`sched_setaffinity`).
//!
//! Pinning is best effort: an empty CPU list (affinity unknown) or a refusal
//! leaves the thread where the scheduler puts it, and a measurement goes on.

/// The CPUs this process may run on (empty if unknown: then nothing is pinned).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data (all-zero is the empty set), and
    // sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Restricts the calling thread to `cpus` (best effort; empty: no change).
/// Indices at or above `CPU_SETSIZE` are left out.
pub fn pin_to(cpus: &[usize]) {
    let max = libc::CPU_SETSIZE as usize;
    if !cpus.iter().any(|&c| c < max) {
        return;
    }
    // SAFETY: the set is plain data built with CPU_ZERO/CPU_SET on CPU indices
    // below CPU_SETSIZE (checked here); pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &c in cpus.iter().filter(|&&c| c < max) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The CPU of thread `i` when threads go round robin over `cpus` (thread i on
/// the i-th CPU, wrapping); empty when `cpus` is empty (not pinned).
pub fn round_robin(cpus: &[usize], i: usize) -> Vec<usize> {
    if cpus.is_empty() {
        Vec::new()
    } else {
        vec![cpus[i % cpus.len()]]
    }
}

/// CPU time (ns, from `/proc/self/task/*/schedstat`) of this process's
/// threads whose name starts with `prefix` (e.g. mmkit's `mmkit-kswapd`),
/// summed; 0 where the kernel does not give it.
pub fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_has_cpus_and_stays_pinned_where_asked() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "sched_getaffinity answered nothing");
        assert_eq!(round_robin(&cpus, cpus.len()), vec![cpus[0]]);
        assert!(round_robin(&[], 3).is_empty());
        let last = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_to(&[last]);
            assert_eq!(allowed_cpus(), vec![last]);
            // Nothing to pin to: no change.
            pin_to(&[]);
            pin_to(&[usize::MAX]);
            assert_eq!(allowed_cpus(), vec![last]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_named_thread_has_cpu_time() {
        let t = std::thread::Builder::new()
            .name("mmlab-cputest".into())
            .spawn(|| {
                let t0 = std::time::Instant::now();
                let mut x = 0u64;
                while t0.elapsed() < std::time::Duration::from_millis(20) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                threads_cpu_ns("mmlab-cputest")
            })
            .unwrap();
        let ns = t.join().unwrap();
        if std::path::Path::new("/proc/self/task").exists() {
            assert!(ns > 0);
        }
        assert_eq!(threads_cpu_ns("no-such-thread-name"), 0);
    }
}
