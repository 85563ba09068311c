//! The receive side of a connection: a buffer the reader thread fills with
//! whatever the socket has (many replies per `recv` when many are in flight)
//! and parses from; payload already buffered is copied out, the rest is
//! received straight into the destination.
//!
//! Invariants: `start <= end <= buf.len()`; bytes `start..end` are received
//! and not yet consumed. Allocated once per reader thread. No locking: the
//! reader thread owns it.

use std::io;
use std::os::fd::RawFd;

use super::proto::recv_exact;

pub(crate) struct Rx {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    fd: RawFd,
}

impl Rx {
    pub(crate) fn new(size: usize) -> Rx {
        Rx {
            buf: vec![0; size].into_boxed_slice(),
            start: 0,
            end: 0,
            fd: -1,
        }
    }

    /// A new connection: nothing buffered.
    pub(crate) fn reset(&mut self, fd: RawFd) {
        (self.start, self.end, self.fd) = (0, 0, fd);
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
            let room = &mut self.buf[self.end..];
            // SAFETY: `room` is an exclusively borrowed part of our buffer.
            let n = unsafe { libc::recv(self.fd, room.as_mut_ptr().cast(), room.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "NBD server closed the connection",
                ));
            }
            self.end += n as usize;
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
        if n > k {
            // SAFETY: the rest of the caller's buffer.
            unsafe { recv_exact(self.fd, dst.add(k), n - k)? };
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
