//! Background threads of an `Mm` (Linux's kthreads): the vmstat worker,
//! kcompactd, kswapd and the NUMA scanner, all built on [`Kthread`].
//!
//! A `Kthread<W>` is the owner's handle on one thread. [`Kthread::start`] spawns
//! the thread, which parks until it is woken with work, its period elapses, or it
//! is told to stop, and then runs its body on the work taken (the default value of
//! `W` after a mere timeout); [`Kthread::wake`] hands it work; dropping the handle
//! stops it. The thread holds nothing of its owner but the handle's control block:
//! a body that needs the `Mm` keeps a `Weak` and upgrades it per run (and ends the
//! thread, by returning false, once the `Mm` is gone).
//!
//! Invariants: "no work" is `W::default()`. The thread takes the pending work,
//! leaving the default, before it runs, so work handed in during a run is the next
//! run's. After a stop the body is not started again; a run in progress finishes
//! (nobody joins the thread: the last `Mm` may be dropped on it).
//!
//! Locking: one mutex over the stop flag and the pending work, held only to read or
//! change them, never while the body runs.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What the owner and the thread share.
struct State<W> {
    stop: bool,
    work: W,
}

struct Control<W> {
    state: Mutex<State<W>>,
    cv: Condvar,
}

impl<W: Default + PartialEq> Control<W> {
    fn lock(&self) -> MutexGuard<'_, State<W>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Parks the thread until there is work, `period` has passed, or a stop; the
    /// work taken (the default after a timeout), or None on a stop.
    fn park(&self, period: Duration) -> Option<W> {
        let s = self.lock();
        let (mut s, _) = self
            .cv
            .wait_timeout_while(s, period, |s| !s.stop && s.work == W::default())
            .unwrap_or_else(|e| e.into_inner());
        if s.stop {
            return None;
        }
        Some(std::mem::take(&mut s.work))
    }
}

/// The owner's handle on one background thread; dropping it stops the thread.
pub(crate) struct Kthread<W> {
    ctl: Arc<Control<W>>,
}

impl<W: Default + PartialEq + Send + 'static> Kthread<W> {
    /// A handle with no thread yet and no work pending.
    pub(crate) fn new() -> Self {
        Kthread {
            ctl: Arc::new(Control {
                state: Mutex::new(State {
                    stop: false,
                    work: W::default(),
                }),
                cv: Condvar::new(),
            }),
        }
    }

    /// Spawns the thread `name`: it runs `body` on the work it is woken with, or on
    /// `W::default()` every `period` without any, until the handle is dropped or
    /// `body` returns false. A thread that cannot be spawned is done without (as
    /// the kernel goes on without a kthread that failed to start).
    pub(crate) fn start(
        &self,
        name: &str,
        period: Duration,
        mut body: impl FnMut(W) -> bool + Send + 'static,
    ) {
        let ctl = self.ctl.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Some(work) = ctl.park(period) {
                    if !body(work) {
                        return;
                    }
                }
            })
            .ok();
    }

    /// Hands the thread work: `update` changes the pending work and says whether
    /// the thread should be woken for it.
    pub(crate) fn wake(&self, update: impl FnOnce(&mut W) -> bool) {
        let mut s = self.ctl.lock();
        if update(&mut s.work) {
            self.ctl.cv.notify_one();
        }
    }

    /// Drops the pending work (a run in progress goes on).
    pub(crate) fn cancel_work(&self) {
        self.ctl.lock().work = W::default();
    }
}

impl<W> Drop for Kthread<W> {
    fn drop(&mut self) {
        self.ctl
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop = true;
        self.ctl.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_on_work_and_on_timeout_and_stops_on_drop() {
        let k = Kthread::<u32>::new();
        let (tx, rx) = mpsc::channel();
        k.start("kthread-test", Duration::from_millis(20), move |w| {
            tx.send(w).is_ok()
        });
        k.wake(|w| {
            *w = 7;
            true
        });
        let wait = Duration::from_secs(5);
        // Timeout runs (on the default) may come first, then the work.
        loop {
            match rx.recv_timeout(wait) {
                Ok(7) => break,
                Ok(0) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
        // Timeouts run on the default.
        assert_eq!(rx.recv_timeout(wait), Ok(0));
        drop(k);
        // The thread ends: its sender goes away once it is out of the loop.
        loop {
            match rx.recv_timeout(wait) {
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("the thread did not stop"),
            }
        }
    }

    #[test]
    fn cancel_drops_pending_work() {
        let k = Kthread::<u32>::new();
        k.wake(|w| {
            *w = 3;
            false
        });
        k.cancel_work();
        assert_eq!(k.ctl.lock().work, 0);
    }
}
