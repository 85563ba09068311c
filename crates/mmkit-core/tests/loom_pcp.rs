//! loom model of the per-CPU list protocol: the owning CPU takes its list with
//! `PcpLock::try_lock` and falls back to the zone when that fails; a remote CPU
//! drains the list by spinning on the same lock. loom explores every interleaving
//! (and the weak-memory orderings of the lock's atomics) and its `UnsafeCell`
//! flags any access to the list outside the lock.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p mmkit-core --test loom_pcp --release`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
use loom::thread;
use mmkit_core::PcpLock;

struct Pcp {
    lock: PcpLock,
    list: UnsafeCell<Vec<u32>>,
}

// SAFETY: `list` is only touched while `lock` is held (loom checks it).
unsafe impl Sync for Pcp {}

fn with_list<R>(p: &Pcp, f: impl FnOnce(&mut Vec<u32>) -> R) -> R {
    p.list.with_mut(|l| f(unsafe { &mut *l }))
}

/// Owner allocates one page and frees it back; the zone has 2 pages, the list 1.
fn owner(p: &Pcp, zone: &Mutex<Vec<u32>>) -> u32 {
    let page = if p.lock.try_lock() {
        let got = with_list(p, |l| l.pop());
        let got = got.unwrap_or_else(|| zone.lock().unwrap().pop().expect("zone empty"));
        p.lock.unlock();
        got
    } else {
        zone.lock().unwrap().pop().expect("zone empty")
    };
    if p.lock.try_lock() {
        with_list(p, |l| l.push(page));
        p.lock.unlock();
    } else {
        zone.lock().unwrap().push(page);
    }
    page
}

fn drain(p: &Pcp, zone: &Mutex<Vec<u32>>) {
    p.lock.lock(loom::thread::yield_now);
    let pages: Vec<u32> = with_list(p, std::mem::take);
    zone.lock().unwrap().extend(pages);
    p.lock.unlock();
}

#[test]
fn local_use_against_remote_drain() {
    loom::model(|| {
        let pcp = Arc::new(Pcp {
            lock: PcpLock::new(),
            list: UnsafeCell::new(vec![1]),
        });
        let zone = Arc::new(Mutex::new(vec![2, 3]));
        let (p2, z2) = (pcp.clone(), zone.clone());
        let remote = thread::spawn(move || drain(&p2, &z2));
        let page = owner(&pcp, &zone);
        remote.join().unwrap();
        drain(&pcp, &zone);
        let mut all = zone.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3], "a page was lost or duplicated");
        assert!([1, 2, 3].contains(&page));
    });
}

#[test]
fn owner_falls_back_to_zone_while_remote_drains() {
    loom::model(|| {
        let pcp = Arc::new(Pcp {
            lock: PcpLock::new(),
            list: UnsafeCell::new(vec![7]),
        });
        let zone = Arc::new(Mutex::new(vec![8]));
        let (p2, z2) = (pcp.clone(), zone.clone());
        let a = thread::spawn(move || drain(&p2, &z2));
        owner(&pcp, &zone);
        a.join().unwrap();
        drain(&pcp, &zone);
        let mut all = zone.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, vec![7, 8]);
    });
}
