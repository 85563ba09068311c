//! The receive side of a connection: a buffer that whoever receives replies
//! (the caller holding the connection's `rx` lock, see `conn`) fills with
//! whatever the socket has (many replies per `recv` when many are in flight)
//! and parses from; payload already buffered is copied out, the rest is
//! received straight into the destination.
//!
//! The socket's receive timeout is a short tick: a receive that finds nothing
//! for a tick checks the receiver's deadline (`TimedOut` once it passed) and
//! goes on waiting otherwise. A receiver alone on its connection may first
//! poll the socket for a few microseconds (`spin`): a reply that comes that
//! soon then costs no sleep and no wakeup.
//!
//! Invariants: `start <= end <= buf.len()`; bytes `start..end` are received
//! and not yet consumed. Allocated once per connection. Locking: the `rx`
//! mutex of the connection owns it.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::proto::closed;
use crate::page_io::{cvt, retry_eintr};

pub(crate) struct Rx {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    pub(crate) fd: RawFd,
    /// The current receiver's deadline.
    pub(crate) deadline: Option<Instant>,
    /// How long a receive polls before it sleeps (zero: it sleeps at once).
    pub(crate) spin: Duration,
}

impl Rx {
    pub(crate) fn new(size: usize) -> Rx {
        Rx {
            buf: vec![0; size].into_boxed_slice(),
            start: 0,
            end: 0,
            fd: -1,
            deadline: None,
            spin: Duration::ZERO,
        }
    }

    /// A new connection (or none, `-1`): nothing buffered.
    pub(crate) fn reset(&mut self, fd: RawFd) {
        (self.start, self.end, self.fd) = (0, 0, fd);
    }

    /// Bytes received and not consumed yet.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// One `recv` of at most `len` bytes into `p` (all of them with
    /// `MSG_WAITALL`), waiting until the deadline; 0 bytes is an error (EOF).
    ///
    /// # Safety
    /// `p` is valid for writes of `len` bytes and nothing else accesses it.
    unsafe fn recv(&self, p: *mut u8, len: usize, flags: i32) -> io::Result<usize> {
        if !self.spin.is_zero() {
            // SAFETY: the caller's contract.
            if let Some(n) = unsafe { self.recv_spinning(p, len)? } {
                return Ok(n);
            }
        }
        loop {
            // SAFETY: the caller's contract.
            let r = retry_eintr(|| cvt(unsafe { libc::recv(self.fd, p.cast(), len, flags) }));
            match r {
                Ok(0) => return Err(closed()),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "NBD reply: none before the deadline",
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Polls the socket without sleeping for up to `spin`: `None` when
    /// nothing came (the caller then sleeps in `recv`).
    ///
    /// # Safety
    /// As for `recv`.
    unsafe fn recv_spinning(&self, p: *mut u8, len: usize) -> io::Result<Option<usize>> {
        let until = Instant::now() + self.spin;
        loop {
            // SAFETY: the caller's contract.
            let r = cvt(unsafe { libc::recv(self.fd, p.cast(), len, libc::MSG_DONTWAIT) });
            match r {
                Ok(0) => return Err(closed()),
                Ok(n) => return Ok(Some(n)),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }

    /// Makes at least `want` (at most the buffer's size) bytes available.
    fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.end - self.start >= want {
            return Ok(());
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end < want {
            let room = self.buf.len() - self.end;
            // SAFETY: `end..` is an exclusively borrowed part of our buffer.
            let p = unsafe { self.buf.as_mut_ptr().add(self.end) };
            // SAFETY: `room` bytes from `p` are ours (above).
            self.end += unsafe { self.recv(p, room, 0)? };
        }
        Ok(())
    }

    /// Fills `out` (small: headers).
    pub(crate) fn read(&mut self, out: &mut [u8]) -> io::Result<()> {
        self.fill(out.len())?;
        out.copy_from_slice(&self.buf[self.start..self.start + out.len()]);
        self.start += out.len();
        Ok(())
    }

    /// Receives `n` bytes into `dst`.
    ///
    /// # Safety
    /// `dst` is valid for writes of `n` bytes and nothing else accesses it.
    pub(crate) unsafe fn read_raw(&mut self, dst: *mut u8, n: usize) -> io::Result<()> {
        let k = n.min(self.end - self.start);
        // SAFETY: `k` buffered bytes into the caller's buffer of `n >= k`.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), dst, k) };
        self.start += k;
        let mut done = k;
        while done < n {
            // SAFETY: the rest of the caller's buffer.
            done += unsafe { self.recv(dst.add(done), n - done, libc::MSG_WAITALL)? };
        }
        Ok(())
    }

    /// Discards `n` bytes.
    pub(crate) fn skip(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            let k = n.min(self.buf.len());
            self.fill(k)?;
            self.start += k;
            n -= k;
        }
        Ok(())
    }
}
