//! One caller's batches on an NBD device: many requests in flight before
//! any reply is waited for (`conn`'s tickets). Pageout's write runs
//! (`write_runs`) and windows of page reads (`read_pages`: up to a depth of
//! reads in flight, refilled in one `sendmsg` per connection).
//!
//! Invariants: every ticket taken is completed before the call returns
//! (also on errors), so no request slot stays held and no reply lands in a
//! buffer after it; a caller that holds tickets never blocks for a request
//! slot (its own tickets could be holding them): it completes its oldest
//! request instead. Nothing is allocated: the tickets in flight are a ring
//! on the stack.
//!
//! Locking: none of its own (`conn`'s).

use std::io;

use super::conn::{Client, Ticket, MAX_IOV_PAGES};
use super::{NbdBackend, PAGE, STRIPE, WRITE_BATCH};

/// Reads one `read_pages` call has in flight at most.
pub const NBD_READ_DEPTH_MAX: usize = 128;

/// A caller's requests in flight, oldest first, each with a number of the
/// caller's (the run or page it belongs to): a ring on the stack.
struct TicketQueue<const N: usize> {
    q: [Option<(usize, Ticket)>; N],
    head: usize,
    n: usize,
}

impl<const N: usize> TicketQueue<N> {
    fn new() -> Self {
        TicketQueue {
            q: std::array::from_fn(|_| None),
            head: 0,
            n: 0,
        }
    }
    fn is_empty(&self) -> bool {
        self.n == 0
    }
    fn is_full(&self) -> bool {
        self.n == N
    }
    fn push(&mut self, run: usize, t: Ticket) {
        debug_assert!(!self.is_full());
        self.q[(self.head + self.n) % N] = Some((run, t));
        self.n += 1;
    }
    fn len(&self) -> usize {
        self.n
    }
    /// The oldest request, if its reply is in (completing it will not wait).
    fn oldest_done(&self, cl: &Client) -> bool {
        self.q[self.head]
            .as_ref()
            .is_some_and(|(_, t)| cl.is_done(t))
    }
    /// Waits for the oldest request; a failure is reported for its number.
    fn complete_oldest(&mut self, cl: &Client, fail: &mut dyn FnMut(usize, io::Error)) {
        let Some((run, t)) = self.q[self.head].take() else {
            return;
        };
        self.head = (self.head + 1) % N;
        self.n -= 1;
        if let Err(e) = cl.complete(t) {
            fail(run, e);
        }
    }
}

impl NbdBackend {
    /// Writes `runs` (first slot, whole pages of contiguous slots): every
    /// request of every run is sent before any reply is waited for (up to
    /// [`WRITE_BATCH`] in flight), so a batch costs about one round trip.
    /// `fail(run, error)` is called for each request of a run that failed
    /// (so at least once for a run that did not reach the server whole).
    /// Allocates nothing.
    pub(crate) fn write_runs(
        &self,
        runs: &[(u32, &[&[u8]])],
        fail: &mut dyn FnMut(usize, io::Error),
    ) {
        let check = |first: u32, pages: &[&[u8]]| {
            if pages.iter().any(|p| p.len() as u64 != PAGE) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "NBD writes whole pages",
                ));
            }
            self.check(first as u64 * PAGE, pages.len() * PAGE as usize)
        };
        // Trims of these slots out of the way first, while no ticket is held:
        // a writer that waits for the trimmer must not hold request slots the
        // trimmer may be waiting for.
        if let Some(t) = &self.trim {
            for &(first, pages) in runs {
                if check(first, pages).is_ok() {
                    t.before_write(first, pages.len() as u32);
                }
            }
        }
        let mut q = TicketQueue::<WRITE_BATCH>::new();
        for (r, &(first, pages)) in runs.iter().enumerate() {
            if let Err(e) = check(first, pages) {
                fail(r, e);
                continue;
            }
            let mut done = 0usize;
            while done < pages.len() {
                let slot = first as u64 + done as u64;
                let to_stripe = (STRIPE - slot % STRIPE) as usize;
                let n = (pages.len() - done).min(to_stripe).min(MAX_IOV_PAGES);
                let ci = self.conn_of(slot);
                let off = (slot + 1) * PAGE;
                let sent = loop {
                    match self
                        .cl
                        .submit_write(ci, off, &pages[done..done + n], q.is_empty())
                    {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            q.complete_oldest(&self.cl, fail);
                        }
                        r => break r,
                    }
                };
                match sent {
                    Ok(t) => {
                        if q.is_full() {
                            q.complete_oldest(&self.cl, fail);
                        }
                        q.push(r, t);
                    }
                    Err(e) => {
                        // The rest of this run is not sent: it failed.
                        fail(r, e);
                        break;
                    }
                }
                done += n;
            }
        }
        while !q.is_empty() {
            q.complete_oldest(&self.cl, fail);
        }
    }

    /// Reads the pages at swap-area offsets `offsets` into `bufs` (page `k`
    /// into `bufs[4096 * k..]`), keeping up to `depth` reads in flight
    /// (at most [`NBD_READ_DEPTH_MAX`]); as replies come in, the window is
    /// refilled, one `sendmsg` per connection. The first error is returned
    /// once every read in flight completed; `bufs` then holds no data to be
    /// trusted.
    pub fn read_pages(&self, offsets: &[u64], bufs: &mut [u8], depth: usize) -> io::Result<()> {
        if bufs.len() as u64 != offsets.len() as u64 * PAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NBD read_pages: one 4096-byte buffer per offset",
            ));
        }
        for &off in offsets {
            self.check(off, PAGE as usize)?;
        }
        let depth = depth.clamp(1, NBD_READ_DEPTH_MAX);
        let base = bufs.as_mut_ptr();
        let nconns = self.cl.conns.len();
        let mut q = TicketQueue::<NBD_READ_DEPTH_MAX>::new();
        // Per connection: the pages taken into the window and not sent yet.
        let mut unsent = [[0u32; NBD_READ_DEPTH_MAX]; super::NBD_MAX_CONNECTIONS];
        let mut nunsent = [0usize; super::NBD_MAX_CONNECTIONS];
        let mut next = 0usize;
        let mut err: Option<io::Error> = None;
        loop {
            let waiting: usize = nunsent.iter().sum();
            while err.is_none() && next < offsets.len() && q.len() + waiting < depth {
                let ci = self.conn_of(offsets[next] / PAGE);
                unsent[ci][nunsent[ci]] = next as u32;
                nunsent[ci] += 1;
                next += 1;
                if q.len() + nunsent.iter().sum::<usize>() >= depth {
                    break;
                }
            }
            for ci in 0..nconns {
                if err.is_some() || nunsent[ci] == 0 {
                    continue;
                }
                let mut reqs = [(0u64, std::ptr::null_mut::<u8>(), 0usize); NBD_READ_DEPTH_MAX];
                for (r, &k) in reqs.iter_mut().zip(&unsent[ci][..nunsent[ci]]) {
                    let slot = offsets[k as usize] / PAGE;
                    // SAFETY: page `k` of `bufs`, inside it (length checked).
                    let dst = unsafe { base.add(k as usize * PAGE as usize) };
                    *r = ((slot + 1) * PAGE, dst, PAGE as usize);
                }
                let pages = &unsent[ci];
                // SAFETY: each destination is its own page of `bufs`, borrowed
                // mutably for the whole call; every ticket is completed
                // before the call returns.
                let sent = unsafe {
                    self.cl
                        .submit_reads(ci, &reqs[..nunsent[ci]], q.is_empty(), &mut |k, t| {
                            q.push(pages[k] as usize, t)
                        })
                };
                match sent {
                    Ok(m) => {
                        unsent[ci].copy_within(m..nunsent[ci], 0);
                        nunsent[ci] -= m;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => err = Some(e),
                }
            }
            if q.is_empty() {
                if err.is_some() || (next == offsets.len() && nunsent.iter().all(|&n| n == 0)) {
                    break;
                }
                continue;
            }
            // The oldest, then every one already answered: the next refill
            // goes out in as few sends as possible.
            q.complete_oldest(&self.cl, &mut |_, e| {
                err.get_or_insert(e);
            });
            while q.oldest_done(&self.cl) {
                q.complete_oldest(&self.cl, &mut |_, e| {
                    err.get_or_insert(e);
                });
            }
        }
        err.map_or(Ok(()), Err)
    }
}
