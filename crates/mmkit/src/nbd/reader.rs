//! The receive side of an NBD connection: parsing one reply (simple, or a
//! structured chunk) and completing the slot it names, for whichever caller
//! holds `rx` (`conn`'s leader/follower receiving); the watcher thread that
//! waits (in `poll`, woken by neither requests nor replies) for the
//! connection to break, resets its slots (reads to be re-sent, writes
//! failed) and reconnects with backoff, checking the header's epoch each
//! time; and the one-request-at-a-time exchange used on a connection nobody
//! else uses yet.
//!
//! Invariants and locking: those of `conn` (this is its other half). A
//! receiver takes a slot's lock only to move it between phases; the watcher
//! resets and reconnects holding `rx`, so nobody receives meanwhile.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::conn::*;
use super::proto::{self, *};
use super::rx::Rx;

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
/// for a read. `Ok(Err(..))`: the server answered with an error (the socket
/// is still usable); `Err(..)`: the socket is unusable.
pub(crate) fn sync_io(
    fd: RawFd,
    cmd: u16,
    offset: u64,
    data: &mut [u8],
    scratch: &mut [u8],
) -> io::Result<io::Result<()>> {
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
    let mut failed = None;
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
                    return Ok(Err(errno_err(e as i32, "header page")));
                }
                if cmd == CMD_READ {
                    recv_buf(fd, data)?;
                }
                return Ok(Ok(()));
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
                        failed.get_or_insert(be32(&e).max(1) as i32);
                    }
                    _ => drain(fd, len, scratch)?,
                }
                if flags & REPLY_FLAG_DONE != 0 {
                    if let Some(e) = failed {
                        return Ok(Err(errno_err(e, "header page")));
                    }
                    if cmd == CMD_READ && covered < data.len() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "short read"));
                    }
                    return Ok(Ok(()));
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
        let fd = match proto::connect(
            &self.uri.target,
            self.timeout.max(super::NBD_DEFAULT_TIMEOUT),
        )
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
        if let Err(e) = sync_io(fd.as_raw_fd(), CMD_READ, 0, head, rest).and_then(|r| r) {
            return Ok(Err(e));
        }
        if head[..self.header.len()] != self.header {
            return Err(());
        }
        if let Err(e) = super::check_export(&info, self.need) {
            return Ok(Err(e));
        }
        Ok(set_rx_tick(&fd, RX_TICK).map(|()| (fd, info)))
    }

    /// The watcher thread of connection `ci`; `first` is its connection
    /// from `swapon`.
    pub(crate) fn watcher(self: Arc<Client>, ci: usize, first: (OwnedFd, ExportInfo)) {
        let c = &self.conns[ci];
        let mut scratch = vec![0u8; 64 << 10];
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
            {
                let mut rx = c.rx.lock();
                rx.reset(raw);
                *c.shut_fd.lock() = raw;
                c.broken.store(false, Ordering::Release);
                let mut l = c.link.lock();
                l.fd = raw;
                l.up = !self.stopping();
                l.df = info.structured && info.flags & TFLAG_SEND_DF != 0;
            }
            c.link_cv.notify_all();
            if !self.stopping() {
                self.watch(c, raw);
            }
            c.shutdown();
            {
                let mut rx = c.rx.lock();
                self.reset(c);
                rx.reset(-1);
                *c.shut_fd.lock() = -1;
            }
            drop(fd);
        }
    }

    /// Waits until connection `fd` breaks: the server hangs up, or someone
    /// shut it down (an error, a deadline, `swapoff`). `POLLRDHUP` alone is
    /// asked for, so replies arriving do not wake this thread.
    fn watch(&self, c: &Conn, fd: RawFd) {
        loop {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            };
            // SAFETY: one pollfd we own; `fd` stays open until we return.
            let r = unsafe { libc::poll(&mut p, 1, 1000) };
            let gone = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
            if (r > 0 && p.revents & gone != 0)
                || c.broken.load(Ordering::Acquire)
                || self.stopping()
            {
                return;
            }
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
        let r = unsafe { rx.read_raw(p.add(at as usize), n as usize) };
        let mut s = slot.st.lock();
        s.phase = Phase::InFlight;
        if r.is_ok() {
            s.covered += n;
        }
        r
    }

    fn complete_slot(&self, c: &Conn, i: usize, err: u32) {
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

    /// Receives one reply (a simple reply, or one structured chunk) and
    /// applies it: the slot it completed, if it completed one.
    pub(super) fn recv_one(&self, c: &Conn, rx: &mut Rx) -> io::Result<Option<usize>> {
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
                self.complete_slot(c, i, err);
                Ok(Some(i))
            }
            STRUCTURED_REPLY_MAGIC => {
                let (flags, ty) = (be16(&h[4..]), be16(&h[6..]));
                let mut l = [0u8; 4];
                rx.read(&mut l)?;
                let i = self.slot_of(c, cookie)?;
                self.chunk(c, i, ty, be32(&l), rx)?;
                if flags & REPLY_FLAG_DONE != 0 {
                    self.complete_slot(c, i, 0);
                    return Ok(Some(i));
                }
                Ok(None)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad reply magic",
            )),
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
