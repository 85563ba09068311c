//! NBD connections in the transmission phase: a fixed table of request slots
//! per connection (the cookie names the slot and its generation), callers that
//! send their own requests and sleep on their slot, and one reader thread per
//! connection that receives replies (simple or structured) straight into the
//! waiting caller's buffer, and reconnects with backoff when the connection
//! breaks.
//!
//! Slot phases: `Free` -> `Ready` (a caller holds it) -> `InFlight` (sent) ->
//! `Receiving` (the reader copies payload into the caller's buffer) ->
//! `InFlight` ... -> `Done` (the caller reads the result and frees it).
//! A broken connection turns `InFlight` reads into `Resend` (the caller sends
//! them again once the link is back) and `InFlight` writes and trims into
//! `Done(ECONNRESET)`. A caller whose deadline passes turns `InFlight` into
//! `Cancelled` and shuts the connection down (a server that does not answer
//! in time is treated as hung); the reader frees a `Cancelled` slot when its
//! reply arrives (draining the payload) or when the connection resets.
//!
//! Invariants: the reader writes into a caller's buffer only in `Receiving`,
//! which it enters from `InFlight` under the slot lock; a caller returns only
//! from `Done`, `Ready`/`Resend` (never sent or handed back) or after turning
//! `InFlight` into `Cancelled`: so no reply ever lands in a buffer after its
//! owner returned. Everything (slots, free stacks, iovec arrays, the reader's
//! scratch buffer) is allocated when the connection is created; requests
//! allocate nothing.
//!
//! Locking: `link` (the send lock: socket, up/down, iovec scratch) before a
//! slot's lock; `free` and `shut_fd` are leaves. The reader holds no lock while
//! it blocks in `recv`; a sender holds `link` while it blocks in `sendmsg`
//! (bounded by the socket's send timeout).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::proto::{self, *};
use super::rx::Rx;
use super::uri::NbdUri;

/// Request slots per connection (requests in flight on it at most).
pub(crate) const NR_SLOTS: usize = 64;
/// Pages of one request at most (one iovec each, plus the header).
pub(crate) const MAX_IOV_PAGES: usize = 256;
const SYNC_COOKIE: u64 = u64::MAX;
const BACKOFF_MIN: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_millis(250);

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Phase {
    Free,
    Ready,
    InFlight,
    Receiving,
    Resend,
    Done,
    Cancelled,
}

struct BufPtr(*mut u8);
// SAFETY: the pointer is dereferenced only by the reader while the slot is in
// `Receiving`, during which its owner waits (module invariants).
unsafe impl Send for BufPtr {}

struct SlotState {
    phase: Phase,
    cmd: u16,
    gen: u32,
    offset: u64,
    len: u32,
    buf: BufPtr,
    covered: u32,
    err: i32,
}

struct Slot {
    st: Mutex<SlotState>,
    cv: Condvar,
}

struct IoVecs(Box<[libc::iovec]>);
// SAFETY: the iovecs are scratch space written and used under the `link` lock
// within one send; stale pointers left in them are never dereferenced.
unsafe impl Send for IoVecs {}

struct Link {
    fd: RawFd,
    up: bool,
    df: bool,
    iov: IoVecs,
}

struct FreeStack {
    idx: [u16; NR_SLOTS],
    n: usize,
}

/// One connection.
pub(crate) struct Conn {
    slots: Box<[Slot]>,
    free: Mutex<FreeStack>,
    free_cv: Condvar,
    link: Mutex<Link>,
    link_cv: Condvar,
    shut_fd: Mutex<RawFd>,
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
            }),
            link_cv: Condvar::new(),
            shut_fd: Mutex::new(-1),
        }
    }

    fn shutdown(&self) {
        let fd = self.shut_fd.lock();
        if *fd >= 0 {
            // SAFETY: the fd is open while `shut_fd` holds it (the reader closes
            // it only after clearing `shut_fd` under this lock).
            unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
        }
    }

    fn put_slot(&self, i: usize) {
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

enum Outcome {
    Done(i32),
    Resend,
    TimedOut,
}

fn errno_err(e: i32, what: &str) -> io::Error {
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

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn drain(fd: RawFd, mut n: usize, scratch: &mut [u8]) -> io::Result<()> {
    while n > 0 {
        let k = n.min(scratch.len());
        recv_buf(fd, &mut scratch[..k])?;
        n -= k;
    }
    Ok(())
}

/// One request and its reply on a connection nobody else uses (the header
/// page at `swapon` and on reconnect). `data` is written for a write, filled
/// for a read. Errors of any kind are returned; the socket is then unusable.
pub(crate) fn sync_io(
    fd: RawFd,
    cmd: u16,
    offset: u64,
    data: &mut [u8],
    scratch: &mut [u8],
) -> io::Result<()> {
    let h = request(0, cmd, SYNC_COOKIE, offset, data.len() as u32);
    let mut iov = [
        libc::iovec {
            iov_base: h.as_ptr() as *mut libc::c_void,
            iov_len: h.len(),
        },
        libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: if cmd == CMD_WRITE { data.len() } else { 0 },
        },
    ];
    sendv_all(fd, &mut iov)?;
    let mut covered = 0;
    loop {
        let mut r = [0u8; 16];
        recv_buf(fd, &mut r)?;
        if be64(&r[8..]) != SYNC_COOKIE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad cookie"));
        }
        match be32(&r) {
            SIMPLE_REPLY_MAGIC => {
                let e = be32(&r[4..]);
                if e != 0 {
                    return Err(errno_err(e as i32, "header page"));
                }
                if cmd == CMD_READ {
                    recv_buf(fd, data)?;
                }
                return Ok(());
            }
            STRUCTURED_REPLY_MAGIC => {
                let (flags, ty) = (be16(&r[4..]), be16(&r[6..]));
                let mut l = [0u8; 4];
                recv_buf(fd, &mut l)?;
                let len = be32(&l) as usize;
                match ty {
                    REPLY_TYPE_OFFSET_DATA if len >= 8 && cmd == CMD_READ => {
                        let mut o = [0u8; 8];
                        recv_buf(fd, &mut o)?;
                        let at = be64(&o).wrapping_sub(offset) as usize;
                        let dst = data
                            .get_mut(at..at.saturating_add(len - 8))
                            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "chunk"))?;
                        recv_buf(fd, dst)?;
                        covered += len - 8;
                    }
                    REPLY_TYPE_OFFSET_HOLE if len == 12 && cmd == CMD_READ => {
                        let mut o = [0u8; 12];
                        recv_buf(fd, &mut o)?;
                        let at = be64(&o).wrapping_sub(offset) as usize;
                        let n = be32(&o[8..]) as usize;
                        data.get_mut(at..at.saturating_add(n))
                            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "hole"))?
                            .fill(0);
                        covered += n;
                    }
                    t if t & REPLY_TYPE_ERROR_BIT != 0 && len >= 6 => {
                        let mut e = [0u8; 4];
                        recv_buf(fd, &mut e)?;
                        drain(fd, len - 4, scratch)?;
                        return Err(errno_err(be32(&e).max(1) as i32, "header page"));
                    }
                    _ => drain(fd, len, scratch)?,
                }
                if flags & REPLY_FLAG_DONE != 0 {
                    if cmd == CMD_READ && covered < data.len() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "short read"));
                    }
                    return Ok(());
                }
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad reply magic",
                ))
            }
        }
    }
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

    fn get_slot(&self, c: &Conn, deadline: Instant) -> io::Result<usize> {
        let mut f = c.free.lock();
        while f.n == 0 {
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

    /// Sends the request of slot `i` (and `pages`, for a write) once the link
    /// is up; the slot is then `InFlight`.
    fn send(&self, c: &Conn, i: usize, pages: &[&[u8]], deadline: Instant) -> io::Result<()> {
        let mut l = c.link.lock();
        loop {
            if self.lost.load(Ordering::Acquire) {
                return Err(lost_err());
            }
            if l.up {
                break;
            }
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("NBD device is going away"));
            }
            if c.link_cv.wait_until(&mut l, deadline).timed_out() && !l.up {
                return Err(timed_out("reconnect"));
            }
        }
        let h = {
            let mut s = c.slots[i].st.lock();
            s.phase = Phase::InFlight;
            s.covered = 0;
            s.err = 0;
            let flags = if s.cmd == CMD_READ && l.df {
                CMD_FLAG_DF
            } else {
                0
            };
            let cookie = (s.gen as u64) << 32 | i as u64;
            request(flags, s.cmd, cookie, s.offset, s.len)
        };
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
            // The reader resets the connection and settles the slot.
            c.shutdown();
        }
        Ok(())
    }

    fn wait(&self, c: &Conn, i: usize, deadline: Instant) -> Outcome {
        let slot = &c.slots[i];
        let mut s = slot.st.lock();
        loop {
            match s.phase {
                Phase::Done => return Outcome::Done(s.err),
                Phase::Resend => return Outcome::Resend,
                Phase::InFlight | Phase::Receiving => {}
                p => unreachable!("waiting on a slot in {p:?}"),
            }
            if slot.cv.wait_until(&mut s, deadline).timed_out() {
                match s.phase {
                    Phase::InFlight => {
                        s.phase = Phase::Cancelled;
                        drop(s);
                        self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                        c.shutdown();
                        return Outcome::TimedOut;
                    }
                    // The reader is copying into our buffer: cut the socket so
                    // that it fails or finishes now, and wait for it.
                    Phase::Receiving => c.shutdown(),
                    _ => {}
                }
            }
        }
    }

    /// Runs one request on connection `ci` (re-sending a read the reader
    /// handed back) until it completes or `deadline` passes.
    fn run(&self, ci: usize, req: Req, pages: &[&[u8]], deadline: Instant) -> io::Result<()> {
        let Req {
            cmd,
            offset,
            len,
            buf,
        } = req;
        let what = match cmd {
            CMD_READ => "read",
            CMD_WRITE => "write",
            _ => "trim",
        };
        let c = &self.conns[ci];
        let i = self.get_slot(c, deadline)?;
        {
            let mut s = c.slots[i].st.lock();
            s.cmd = cmd;
            s.offset = offset;
            s.len = len as u32;
            s.buf = BufPtr(buf);
        }
        loop {
            if let Err(e) = self.send(c, i, pages, deadline) {
                c.put_slot(i);
                return Err(e);
            }
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
                }
                Outcome::TimedOut => return Err(timed_out(what)),
            }
        }
    }

    /// Reads `buf.len()` bytes at export offset `offset` on connection `ci`.
    pub(crate) fn read(&self, ci: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let (len, buf) = (buf.len(), buf.as_mut_ptr());
        let req = Req {
            cmd: CMD_READ,
            offset,
            len,
            buf,
        };
        self.run(ci, req, &[], deadline)
    }

    /// Writes `pages` (at most [`MAX_IOV_PAGES`]) contiguously at `offset`.
    pub(crate) fn write(&self, ci: usize, offset: u64, pages: &[&[u8]]) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let len = pages.iter().map(|p| p.len()).sum();
        let buf = std::ptr::null_mut();
        let req = Req {
            cmd: CMD_WRITE,
            offset,
            len,
            buf,
        };
        self.run(ci, req, pages, deadline)
    }

    /// Trims `len` bytes at `offset`.
    pub(crate) fn trim(&self, ci: usize, offset: u64, len: u32) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let (len, buf) = (len as usize, std::ptr::null_mut());
        let req = Req {
            cmd: CMD_TRIM,
            offset,
            len,
            buf,
        };
        self.run(ci, req, &[], deadline)
    }

    /// Says goodbye on every connection and wakes every reader and waiter.
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

    fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
        for c in self.conns.iter() {
            c.shutdown();
            let _l = c.link.lock();
            c.link_cv.notify_all();
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// A new connection that passed the checks: same export, same epoch.
    /// `Ok(Err(..))`: try again later; `Err(())`: the server lost the data.
    fn reconnect(&self, scratch: &mut [u8]) -> Result<io::Result<(OwnedFd, ExportInfo)>, ()> {
        let fd = match proto::connect(&self.uri.target, self.timeout)
            .and_then(|fd| handshake(fd, &self.uri))
        {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let (fd, info) = fd;
        if info.size < 4096 {
            return Err(());
        }
        let (head, rest) = scratch.split_at_mut(4096);
        if let Err(e) = sync_io(fd.as_raw_fd(), CMD_READ, 0, head, rest) {
            return Ok(Err(e));
        }
        if head[..self.header.len()] != self.header {
            return Err(());
        }
        if let Err(e) = super::check_export(&info, self.need) {
            return Ok(Err(e));
        }
        Ok(clear_rcvtimeo(&fd).map(|()| (fd, info)))
    }

    /// The reader thread of connection `ci`; `first` is its connection from
    /// `swapon`.
    pub(crate) fn reader(self: Arc<Client>, ci: usize, first: (OwnedFd, ExportInfo)) {
        let c = &self.conns[ci];
        let mut scratch = vec![0u8; 64 << 10];
        let mut rx = Rx::new(256 << 10);
        let mut next = Some(first);
        let mut backoff = BACKOFF_MIN;
        loop {
            let (fd, info) = match next.take() {
                Some(x) => x,
                None => {
                    if self.stopping() {
                        return;
                    }
                    match self.reconnect(&mut scratch) {
                        Ok(Ok(x)) => {
                            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                            x
                        }
                        Ok(Err(_)) => {
                            let mut l = c.link.lock();
                            if !self.stopping() {
                                c.link_cv.wait_for(&mut l, backoff);
                            }
                            backoff = (backoff * 2).min(BACKOFF_MAX);
                            continue;
                        }
                        Err(()) => {
                            self.mark_lost();
                            return;
                        }
                    }
                }
            };
            backoff = BACKOFF_MIN;
            let raw = fd.as_raw_fd();
            *c.shut_fd.lock() = raw;
            {
                let mut l = c.link.lock();
                l.fd = raw;
                l.up = !self.stopping();
                l.df = info.structured && info.flags & TFLAG_SEND_DF != 0;
            }
            c.link_cv.notify_all();
            if !self.stopping() {
                rx.reset(raw);
                let _ = self.recv_loop(c, &mut rx);
            }
            self.reset(c);
            *c.shut_fd.lock() = -1;
            drop(fd);
        }
    }

    /// The connection broke: settle every slot that was on it.
    fn reset(&self, c: &Conn) {
        c.shutdown();
        let mut l = c.link.lock();
        l.up = false;
        l.fd = -1;
        for (i, slot) in c.slots.iter().enumerate() {
            let mut s = slot.st.lock();
            match s.phase {
                Phase::InFlight | Phase::Receiving if s.cmd == CMD_READ => {
                    s.phase = Phase::Resend;
                    slot.cv.notify_one();
                }
                Phase::InFlight | Phase::Receiving => {
                    s.phase = Phase::Done;
                    s.err = libc::ECONNRESET;
                    slot.cv.notify_one();
                }
                Phase::Cancelled => {
                    drop(s);
                    c.put_slot(i);
                }
                _ => {}
            }
        }
    }

    fn slot_of(&self, c: &Conn, cookie: u64) -> io::Result<usize> {
        let i = (cookie & 0xffff_ffff) as usize;
        let ok = c.slots.get(i).is_some_and(|slot| {
            let s = slot.st.lock();
            s.gen == (cookie >> 32) as u32 && matches!(s.phase, Phase::InFlight | Phase::Cancelled)
        });
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply for no request in flight",
            ));
        }
        Ok(i)
    }

    /// Receives `n` payload bytes for slot `i` at `at` bytes into its request.
    fn payload(&self, c: &Conn, i: usize, at: u64, n: u32, rx: &mut Rx) -> io::Result<()> {
        let slot = &c.slots[i];
        let mut s = slot.st.lock();
        if s.phase == Phase::Cancelled {
            drop(s);
            return rx.skip(n as usize);
        }
        if s.cmd != CMD_READ || at.saturating_add(n as u64) > s.len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "data outside the request",
            ));
        }
        s.phase = Phase::Receiving;
        let p = s.buf.0;
        drop(s);
        // SAFETY: the slot is `Receiving`, so its owner waits and its buffer
        // of `len` bytes lives; `at + n <= len` was checked above.
        unsafe { rx.read_raw(p.add(at as usize), n as usize)? };
        let mut s = slot.st.lock();
        s.phase = Phase::InFlight;
        s.covered += n;
        Ok(())
    }

    fn complete(&self, c: &Conn, i: usize, err: u32) {
        let slot = &c.slots[i];
        let mut s = slot.st.lock();
        let short = s.cmd == CMD_READ && s.covered < s.len;
        let e = match (err, s.err) {
            (0, 0) if short => libc::EIO,
            (0, e) => e,
            (e, _) => e as i32,
        };
        if s.phase == Phase::Cancelled {
            drop(s);
            c.put_slot(i);
            return;
        }
        s.phase = Phase::Done;
        s.err = e;
        drop(s);
        slot.cv.notify_one();
    }

    fn recv_loop(&self, c: &Conn, rx: &mut Rx) -> io::Result<()> {
        loop {
            let mut h = [0u8; 16];
            rx.read(&mut h)?;
            let cookie = be64(&h[8..]);
            match be32(&h) {
                SIMPLE_REPLY_MAGIC => {
                    let i = self.slot_of(c, cookie)?;
                    let err = be32(&h[4..]);
                    let (cmd, len) = {
                        let s = c.slots[i].st.lock();
                        (s.cmd, s.len)
                    };
                    if err == 0 && cmd == CMD_READ {
                        self.payload(c, i, 0, len, rx)?;
                    }
                    self.complete(c, i, err);
                }
                STRUCTURED_REPLY_MAGIC => {
                    let (flags, ty) = (be16(&h[4..]), be16(&h[6..]));
                    let mut l = [0u8; 4];
                    rx.read(&mut l)?;
                    let i = self.slot_of(c, cookie)?;
                    self.chunk(c, i, ty, be32(&l), rx)?;
                    if flags & REPLY_FLAG_DONE != 0 {
                        self.complete(c, i, 0);
                    }
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "bad reply magic",
                    ));
                }
            }
        }
    }

    fn chunk(&self, c: &Conn, i: usize, ty: u16, len: u32, rx: &mut Rx) -> io::Result<()> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed structured reply");
        let req_off = c.slots[i].st.lock().offset;
        match ty {
            REPLY_TYPE_NONE if len == 0 => Ok(()),
            REPLY_TYPE_OFFSET_DATA if len >= 8 => {
                let mut o = [0u8; 8];
                rx.read(&mut o)?;
                let at = be64(&o).checked_sub(req_off).ok_or_else(bad)?;
                self.payload(c, i, at, len - 8, rx)
            }
            REPLY_TYPE_OFFSET_HOLE if len == 12 => {
                let mut o = [0u8; 12];
                rx.read(&mut o)?;
                let at = be64(&o).checked_sub(req_off).ok_or_else(bad)?;
                let n = be32(&o[8..]);
                let mut s = c.slots[i].st.lock();
                if s.phase == Phase::Cancelled {
                    return Ok(());
                }
                if s.cmd != CMD_READ || at.saturating_add(n as u64) > s.len as u64 {
                    return Err(bad());
                }
                // SAFETY: the slot is `InFlight` under its lock, so its owner
                // waits and its buffer lives; the range was checked above.
                unsafe { std::ptr::write_bytes(s.buf.0.add(at as usize), 0, n as usize) };
                s.covered += n;
                Ok(())
            }
            t if t & REPLY_TYPE_ERROR_BIT != 0 && len >= 6 => {
                let mut e = [0u8; 4];
                rx.read(&mut e)?;
                rx.skip(len as usize - 4)?;
                let mut s = c.slots[i].st.lock();
                if s.err == 0 {
                    s.err = match be32(&e) {
                        0 => libc::EIO,
                        e => e as i32,
                    };
                }
                Ok(())
            }
            _ => Err(bad()),
        }
    }
}
