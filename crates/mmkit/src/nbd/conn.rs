//! NBD connections in the transmission phase: a fixed table of request slots
//! per connection (the cookie names the slot and its generation), callers that
//! send their own requests and receive the replies themselves, and one
//! watcher thread per connection (`reader.rs`) that notices a broken
//! connection, settles its slots and reconnects with backoff.
//!
//! Submit, then wait: a request is sent (`submit_read`, `submit_write`, or
//! many reads in one `sendmsg`, `submit_reads`) and returns a `Ticket` (its
//! connection and slot) without waiting for the reply; `complete` waits for
//! it later, so one caller can have many requests in flight (`batch.rs`).
//! A caller that holds tickets submits without blocking for a request slot.
//!
//! Receiving (leader/follower): a caller waiting for its reply takes the
//! connection's `rx` lock if it is free and receives replies, simple or
//! structured, straight into the buffers of whichever callers they are for,
//! waking them, until its own reply is in; then it lets go and wakes one
//! sleeping caller to take over. A caller that finds `rx` taken sleeps on its
//! slot. With one request in flight the caller sends, receives and returns
//! with no other thread involved.
//!
//! Slot phases: `Free` -> `Ready` (a caller holds it) -> `InFlight` (sent) ->
//! `Receiving` (the receiver copies payload into the caller's buffer) ->
//! `InFlight` ... -> `Done` (the caller reads the result and frees it).
//! A broken connection turns `InFlight` reads into `Resend` (the caller sends
//! them again once the link is back) and `InFlight` writes and trims into
//! `Done(ECONNRESET)`. A caller whose deadline passes turns `InFlight` into
//! `Cancelled` and shuts the connection down (a server that does not answer
//! in time is treated as hung); a `Cancelled` slot is freed when its reply
//! arrives (the payload drained) or when the connection resets.
//!
//! Invariants: a receiver writes into a caller's buffer only in `Receiving`,
//! which it enters from `InFlight` under the slot lock; `complete` returns
//! only from `Done`, `Ready`/`Resend` (never sent or handed back) or after
//! turning `InFlight` into `Cancelled`, and every ticket is completed before
//! its read's buffer goes: so no reply ever lands in a buffer after its
//! owner is done with it. A caller sleeping on an `InFlight` slot counts in
//! `sleepers` (with `sleeping` set under its slot lock) before it tries
//! `rx`, and a receiver that lets go of `rx` then wakes a sleeper: one of the
//! two sees the other (a SeqCst fence on both sides), so replies never sit
//! unread while a caller sleeps. Everything (slots, free stacks, iovec
//! arrays, the receive buffer) is allocated when the connection is created;
//! requests allocate nothing.
//!
//! Locking: `rx` before `link` before a slot's lock; `free` and `shut_fd` are
//! leaves; a caller holding its slot lock only `try_lock`s `rx`. A receiver
//! blocks in `recv` holding `rx` only (the socket's receive timeout is a
//! short tick, so it sees its deadline pass); a sender holds `link` while it
//! blocks in `sendmsg` (bounded by the socket's send timeout).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::proto::*;
use super::rx::Rx;
use super::uri::NbdUri;

/// Request slots per connection (requests in flight on it at most).
pub(crate) const NR_SLOTS: usize = 64;
/// Pages of one request at most (one iovec each, plus the header).
pub(crate) const MAX_IOV_PAGES: usize = 256;
pub(super) const SYNC_COOKIE: u64 = u64::MAX;
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(5);
pub(super) const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// The socket's receive timeout: how often a receiver checks its deadline.
pub(super) const RX_TICK: Duration = Duration::from_millis(20);
/// How long a receiver alone on its connection polls before it sleeps (a
/// reply from a server on this host comes in about 10 us).
const RX_SPIN: Duration = Duration::from_micros(25);
/// The receive buffer of a connection.
const RX_BYTES: usize = 256 << 10;

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    Free,
    Ready,
    InFlight,
    Receiving,
    Resend,
    Done,
    Cancelled,
}

pub(super) struct BufPtr(pub(super) *mut u8);
// SAFETY: the pointer is dereferenced only by a receiver while the slot is in
// `Receiving`, during which its owner waits (module invariants).
unsafe impl Send for BufPtr {}

pub(super) struct SlotState {
    pub(super) phase: Phase,
    pub(super) cmd: u16,
    pub(super) gen: u32,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) buf: BufPtr,
    pub(super) covered: u32,
    pub(super) err: i32,
    /// The owner sleeps on `cv` (and counts in the connection's `sleepers`).
    pub(super) sleeping: bool,
}

pub(super) struct Slot {
    pub(super) st: Mutex<SlotState>,
    pub(super) cv: Condvar,
}

struct IoVecs(Box<[libc::iovec]>);
// SAFETY: the iovecs are scratch space written and used under the `link` lock
// within one send; stale pointers left in them are never dereferenced.
unsafe impl Send for IoVecs {}

pub(super) struct Link {
    pub(super) fd: RawFd,
    pub(super) up: bool,
    pub(super) df: bool,
    iov: IoVecs,
    /// Request headers of one `submit_reads`.
    hdrs: Box<[[u8; 28]]>,
}

struct FreeStack {
    idx: [u16; NR_SLOTS],
    n: usize,
}

/// One connection.
pub(crate) struct Conn {
    pub(super) slots: Box<[Slot]>,
    free: Mutex<FreeStack>,
    pub(super) free_cv: Condvar,
    pub(super) link: Mutex<Link>,
    pub(super) link_cv: Condvar,
    pub(super) shut_fd: Mutex<RawFd>,
    /// The receive side: whoever holds it receives replies.
    pub(super) rx: Mutex<Rx>,
    /// Callers sleeping on an `InFlight` slot.
    sleepers: AtomicUsize,
    /// The connection was shut down (nobody receives on it any more); the
    /// watcher clears it with the next connection.
    pub(super) broken: AtomicBool,
}

impl Conn {
    fn new() -> Conn {
        let iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Conn {
            slots: (0..NR_SLOTS)
                .map(|_| Slot {
                    st: Mutex::new(SlotState {
                        phase: Phase::Free,
                        cmd: 0,
                        gen: 0,
                        offset: 0,
                        len: 0,
                        buf: BufPtr(std::ptr::null_mut()),
                        covered: 0,
                        err: 0,
                        sleeping: false,
                    }),
                    cv: Condvar::new(),
                })
                .collect(),
            free: Mutex::new(FreeStack {
                idx: std::array::from_fn(|i| i as u16),
                n: NR_SLOTS,
            }),
            free_cv: Condvar::new(),
            link: Mutex::new(Link {
                fd: -1,
                up: false,
                df: false,
                iov: IoVecs(vec![iov; MAX_IOV_PAGES + 1].into_boxed_slice()),
                hdrs: vec![[0; 28]; NR_SLOTS].into_boxed_slice(),
            }),
            link_cv: Condvar::new(),
            shut_fd: Mutex::new(-1),
            rx: Mutex::new(Rx::new(RX_BYTES)),
            sleepers: AtomicUsize::new(0),
            broken: AtomicBool::new(true),
        }
    }

    /// After letting go of `rx` (or finding a reply that another receiver
    /// completed): wakes one caller sleeping on an `InFlight` slot, which
    /// takes over receiving.
    pub(super) fn kick(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) == 0 {
            return;
        }
        for slot in self.slots.iter() {
            let s = slot.st.lock();
            if s.sleeping && matches!(s.phase, Phase::InFlight | Phase::Receiving) {
                slot.cv.notify_one();
                return;
            }
        }
    }

    pub(super) fn shutdown(&self) {
        let fd = self.shut_fd.lock();
        self.broken.store(true, Ordering::Release);
        if *fd >= 0 {
            // SAFETY: the fd is open while `shut_fd` holds it (the watcher closes
            // it only after clearing `shut_fd` under this lock).
            unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
        }
    }

    pub(super) fn put_slot(&self, i: usize) {
        self.slots[i].st.lock().phase = Phase::Free;
        let mut f = self.free.lock();
        let n = f.n;
        f.idx[n] = i as u16;
        f.n += 1;
        drop(f);
        self.free_cv.notify_one();
    }
}

/// Counters of the client.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) reconnects: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) error_replies: AtomicU64,
}

/// The client: its connections and what a reconnect checks.
pub(crate) struct Client {
    pub(crate) uri: NbdUri,
    /// Export bytes needed (swap area plus header page).
    pub(crate) need: u64,
    pub(crate) timeout: Duration,
    /// The header page's identifying prefix (magic, epoch, size).
    pub(crate) header: [u8; 40],
    pub(crate) lost: AtomicBool,
    pub(crate) stop: AtomicBool,
    pub(crate) conns: Box<[Conn]>,
    pub(crate) counters: Counters,
}

/// One request: command, export offset, length, read destination.
struct Req {
    cmd: u16,
    offset: u64,
    len: usize,
    buf: *mut u8,
}

/// A request sent and not waited for yet ([`Client::submit_read`],
/// [`Client::submit_write`]): its connection and request slot. The slot stays
/// the holder's until [`Client::complete`] takes the ticket back, so every
/// ticket must be completed.
#[must_use = "a ticket holds a request slot until it is completed"]
pub(crate) struct Ticket {
    ci: usize,
    i: usize,
    deadline: Instant,
}

enum Outcome {
    Done(i32),
    Resend,
    TimedOut,
}

pub(super) fn errno_err(e: i32, what: &str) -> io::Error {
    let os = io::Error::from_raw_os_error(e);
    io::Error::new(os.kind(), format!("NBD {what}: the server answered {os}"))
}

pub(crate) fn lost_err() -> io::Error {
    io::Error::other("NBD server lost its memory (restarted): every slot on it is gone")
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("NBD {what}: no answer before the deadline"),
    )
}

pub(super) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
pub(super) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

impl Client {
    pub(crate) fn new(uri: NbdUri, need: u64, timeout: Duration, nconns: usize) -> Client {
        Client {
            uri,
            need,
            timeout,
            header: [0; 40],
            lost: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: (0..nconns).map(|_| Conn::new()).collect(),
            counters: Counters::default(),
        }
    }

    /// A free request slot of `c`, claimed for a new request: waiting for
    /// one until `deadline` with `block`, `WouldBlock` at once without.
    fn get_slot(&self, c: &Conn, deadline: Instant, block: bool) -> io::Result<usize> {
        let mut f = c.free.lock();
        while f.n == 0 {
            if !block {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "NBD connection: every request slot is in flight",
                ));
            }
            if c.free_cv.wait_until(&mut f, deadline).timed_out() && f.n == 0 {
                return Err(timed_out("request slot"));
            }
        }
        f.n -= 1;
        let i = f.idx[f.n] as usize;
        drop(f);
        let mut s = c.slots[i].st.lock();
        s.gen = s.gen.wrapping_add(1);
        s.phase = Phase::Ready;
        Ok(i)
    }

    /// The link of `c` once it is up (waiting for a reconnect until
    /// `deadline`).
    fn link_up<'c>(&self, c: &'c Conn, deadline: Instant) -> io::Result<MutexGuard<'c, Link>> {
        let mut l = c.link.lock();
        loop {
            if self.lost.load(Ordering::Acquire) {
                return Err(lost_err());
            }
            if l.up {
                return Ok(l);
            }
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("NBD device is going away"));
            }
            if c.link_cv.wait_until(&mut l, deadline).timed_out() && !l.up {
                return Err(timed_out("reconnect"));
            }
        }
    }

    /// Slot `i` goes `InFlight` on a link (`df`: it takes `NBD_CMD_FLAG_DF`):
    /// its request header.
    fn in_flight(&self, c: &Conn, df: bool, i: usize) -> [u8; 28] {
        let mut s = c.slots[i].st.lock();
        s.phase = Phase::InFlight;
        s.covered = 0;
        s.err = 0;
        let flags = if s.cmd == CMD_READ && df {
            CMD_FLAG_DF
        } else {
            0
        };
        let cookie = (s.gen as u64) << 32 | i as u64;
        request(flags, s.cmd, cookie, s.offset, s.len)
    }

    /// Sends the request of slot `i` (and `pages`, for a write) once the link
    /// is up; the slot is then `InFlight`.
    fn send(&self, c: &Conn, i: usize, pages: &[&[u8]], deadline: Instant) -> io::Result<()> {
        let mut l = self.link_up(c, deadline)?;
        let h = self.in_flight(c, l.df, i);
        let fd = l.fd;
        let iov = &mut l.iov.0;
        iov[0] = libc::iovec {
            iov_base: h.as_ptr() as *mut libc::c_void,
            iov_len: h.len(),
        };
        for (v, p) in iov[1..].iter_mut().zip(pages) {
            *v = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
        }
        let r = sendv_all(fd, &mut iov[..1 + pages.len()]);
        drop(l);
        if r.is_err() {
            // The watcher resets the connection and settles the slot.
            c.shutdown();
        }
        Ok(())
    }

    /// Sends the reads `reqs` (export offset, destination, length) on
    /// connection `ci`, all in one `sendmsg`, and hands each one's ticket to
    /// `out(k, ticket)`: those from the first on for which a request slot is
    /// free (`block`: the first may wait for one). Returns how many were
    /// sent; `WouldBlock` when none could be.
    ///
    /// # Safety
    /// As [`Client::submit_read`], for every destination.
    pub(crate) unsafe fn submit_reads(
        &self,
        ci: usize,
        reqs: &[(u64, *mut u8, usize)],
        block: bool,
        out: &mut dyn FnMut(usize, Ticket),
    ) -> io::Result<usize> {
        let c = &self.conns[ci];
        let deadline = Instant::now() + self.timeout;
        let mut slots = [0u16; NR_SLOTS];
        let mut n = 0;
        for (k, &(offset, buf, len)) in reqs.iter().take(NR_SLOTS).enumerate() {
            let i = match self.get_slot(c, deadline, block && k == 0) {
                Ok(i) => i,
                Err(e) if k == 0 => return Err(e),
                Err(_) => break,
            };
            let mut s = c.slots[i].st.lock();
            s.cmd = CMD_READ;
            s.offset = offset;
            s.len = len as u32;
            s.buf = BufPtr(buf);
            slots[n] = i as u16;
            n += 1;
        }
        let mut l = match self.link_up(c, deadline) {
            Ok(l) => l,
            Err(e) => {
                slots[..n].iter().for_each(|&i| c.put_slot(i as usize));
                return Err(e);
            }
        };
        let l = &mut *l;
        for (h, &i) in l.hdrs.iter_mut().zip(&slots[..n]) {
            *h = self.in_flight(c, l.df, i as usize);
        }
        for (v, h) in l.iov.0.iter_mut().zip(&l.hdrs[..n]) {
            *v = libc::iovec {
                iov_base: h.as_ptr() as *mut libc::c_void,
                iov_len: h.len(),
            };
        }
        if sendv_all(l.fd, &mut l.iov.0[..n]).is_err() {
            // The watcher resets the connection and settles the slots.
            c.shutdown();
        }
        for (k, &i) in slots[..n].iter().enumerate() {
            out(
                k,
                Ticket {
                    ci,
                    i: i as usize,
                    deadline,
                },
            );
        }
        Ok(n)
    }

    /// Whether the request of `t` has its reply (completing it will not wait).
    pub(crate) fn is_done(&self, t: &Ticket) -> bool {
        self.conns[t.ci].slots[t.i].st.lock().phase == Phase::Done
    }

    fn wait(&self, c: &Conn, i: usize, deadline: Instant) -> Outcome {
        let o = self.wait_inner(c, i, deadline);
        c.kick();
        o
    }

    fn wait_inner(&self, c: &Conn, i: usize, deadline: Instant) -> Outcome {
        let slot = &c.slots[i];
        let mut s = slot.st.lock();
        loop {
            match s.phase {
                Phase::Done => return Outcome::Done(s.err),
                Phase::Resend => return Outcome::Resend,
                Phase::InFlight | Phase::Receiving => {}
                p => unreachable!("waiting on a slot in {p:?}"),
            }
            s.sleeping = true;
            c.sleepers.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let rx = match c.broken.load(Ordering::Acquire) {
                false => c.rx.try_lock(),
                true => None,
            };
            if let Some(rx) = rx {
                s.sleeping = false;
                c.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(s);
                if let Some(o) = self.lead(c, i, rx, deadline) {
                    return o;
                }
                s = slot.st.lock();
                continue;
            }
            let timed_out = slot.cv.wait_until(&mut s, deadline).timed_out();
            s.sleeping = false;
            c.sleepers.fetch_sub(1, Ordering::SeqCst);
            if timed_out {
                match s.phase {
                    Phase::InFlight => {
                        s.phase = Phase::Cancelled;
                        drop(s);
                        self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                        c.shutdown();
                        return Outcome::TimedOut;
                    }
                    // A receiver is copying into our buffer: cut the socket so
                    // that it fails or finishes now, and wait for it.
                    Phase::Receiving => c.shutdown(),
                    _ => {}
                }
            }
        }
    }

    /// Receives replies on `c` while slot `i` (ours) waits for its own; then
    /// lets go of `rx` (the caller wakes a successor). A receive error breaks
    /// the connection (the watcher resets it); past our deadline the slot is
    /// cancelled here, before anyone can reset it.
    fn lead(
        &self,
        c: &Conn,
        i: usize,
        mut rx: MutexGuard<'_, Rx>,
        deadline: Instant,
    ) -> Option<Outcome> {
        // The watcher publishes a connection's fd in `rx` before its link
        // is up, so a slot sent on it finds it there.
        debug_assert!(rx.fd >= 0);
        rx.deadline = Some(deadline);
        // After our own reply, the replies already buffered are handed out
        // too: their owners wake sooner and fewer need a new receiver.
        let mut own = false;
        let r = loop {
            if own && rx.buffered() == 0 {
                break Ok(());
            }
            // Alone on the connection: poll briefly before sleeping.
            rx.spin = match c.sleepers.load(Ordering::Relaxed) {
                0 => RX_SPIN,
                _ => Duration::ZERO,
            };
            match self.recv_one(c, &mut rx) {
                Ok(Some(done)) if done == i => own = true,
                Ok(_) if !own && Instant::now() >= deadline => break Err(timed_out("reply")),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        rx.deadline = None;
        let mut out = None;
        if let Err(e) = r {
            if e.kind() == io::ErrorKind::TimedOut {
                let mut s = c.slots[i].st.lock();
                if s.phase == Phase::InFlight {
                    s.phase = Phase::Cancelled;
                    self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                    out = Some(Outcome::TimedOut);
                }
            }
            c.shutdown();
        }
        drop(rx);
        out
    }

    /// Sends one request on connection `ci` and returns without waiting for
    /// its reply: the ticket to [`Client::complete`]. `block`: wait for a
    /// free request slot (else `WouldBlock` when every slot is in flight; a
    /// caller that holds tickets must not block, or its own tickets could
    /// hold the slots it waits for).
    ///
    /// # Safety
    /// For a read, `req.buf` is valid for writes of `req.len` bytes, and
    /// nothing else accesses it, until the ticket is completed.
    unsafe fn submit(
        &self,
        ci: usize,
        req: Req,
        pages: &[&[u8]],
        deadline: Instant,
        block: bool,
    ) -> io::Result<Ticket> {
        let c = &self.conns[ci];
        let i = self.get_slot(c, deadline, block)?;
        {
            let mut s = c.slots[i].st.lock();
            s.cmd = req.cmd;
            s.offset = req.offset;
            s.len = req.len as u32;
            s.buf = BufPtr(req.buf);
        }
        if let Err(e) = self.send(c, i, pages, deadline) {
            c.put_slot(i);
            return Err(e);
        }
        Ok(Ticket { ci, i, deadline })
    }

    /// Waits for the request of `t` (re-sending a read that a reset handed
    /// back) until it completes or its deadline passes.
    pub(crate) fn complete(&self, t: Ticket) -> io::Result<()> {
        let Ticket { ci, i, deadline } = t;
        let c = &self.conns[ci];
        let cmd = c.slots[i].st.lock().cmd;
        let what = match cmd {
            CMD_READ => "read",
            CMD_WRITE => "write",
            _ => "trim",
        };
        loop {
            match self.wait(c, i, deadline) {
                Outcome::Done(e) => {
                    c.put_slot(i);
                    if e != 0 {
                        self.counters.error_replies.fetch_add(1, Ordering::Relaxed);
                        return Err(errno_err(e, what));
                    }
                    return Ok(());
                }
                Outcome::Resend => {
                    self.counters.resent.fetch_add(1, Ordering::Relaxed);
                    // A write or trim is never handed back (it fails), so a
                    // read has no pages to send.
                    if let Err(e) = self.send(c, i, &[], deadline) {
                        c.put_slot(i);
                        return Err(e);
                    }
                }
                Outcome::TimedOut => return Err(timed_out(what)),
            }
        }
    }

    /// Sends a read of `len` bytes at export offset `offset` into `buf`.
    ///
    /// # Safety
    /// `buf` is valid for writes of `len` bytes, and nothing else accesses
    /// it, until the ticket is completed.
    pub(crate) unsafe fn submit_read(
        &self,
        ci: usize,
        offset: u64,
        buf: *mut u8,
        len: usize,
        block: bool,
    ) -> io::Result<Ticket> {
        let deadline = Instant::now() + self.timeout;
        let req = Req {
            cmd: CMD_READ,
            offset,
            len,
            buf,
        };
        // SAFETY: the caller's contract.
        unsafe { self.submit(ci, req, &[], deadline, block) }
    }

    /// Reads `buf.len()` bytes at export offset `offset` on connection `ci`.
    pub(crate) fn read(&self, ci: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // SAFETY: `buf` is borrowed mutably until the ticket completes here.
        let t = unsafe { self.submit_read(ci, offset, buf.as_mut_ptr(), buf.len(), true)? };
        self.complete(t)
    }

    /// Sends a write of `pages` (at most [`MAX_IOV_PAGES`]) contiguously at
    /// `offset`; the pages are on the socket when it returns.
    pub(crate) fn submit_write(
        &self,
        ci: usize,
        offset: u64,
        pages: &[&[u8]],
        block: bool,
    ) -> io::Result<Ticket> {
        let deadline = Instant::now() + self.timeout;
        let req = Req {
            cmd: CMD_WRITE,
            offset,
            len: pages.iter().map(|p| p.len()).sum(),
            buf: std::ptr::null_mut(),
        };
        // SAFETY: not a read: no buffer is written.
        unsafe { self.submit(ci, req, pages, deadline, block) }
    }

    /// Trims `len` bytes at `offset`.
    pub(crate) fn trim(&self, ci: usize, offset: u64, len: u32) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let req = Req {
            cmd: CMD_TRIM,
            offset,
            len: len as usize,
            buf: std::ptr::null_mut(),
        };
        // SAFETY: not a read: no buffer is written.
        let t = unsafe { self.submit(ci, req, &[], deadline, true)? };
        self.complete(t)
    }

    /// Says goodbye on every connection and wakes every watcher and waiter.
    pub(crate) fn shutdown_all(&self) {
        self.stop.store(true, Ordering::Release);
        for c in self.conns.iter() {
            let l = c.link.lock();
            if l.up {
                let h = request(0, CMD_DISC, 0, 0, 0);
                let _ = send_all(l.fd, &h);
            }
            drop(l);
            c.shutdown();
            c.link_cv.notify_all();
        }
    }
}
