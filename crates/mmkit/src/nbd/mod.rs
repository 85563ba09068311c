//! Far memory: swap to a Network Block Device export (the NBD project's
//! protocol, served by nbdkit, nbd-server, qemu-storage-daemon...). mmkit's own
//! client: fixed-newstyle negotiation (`uri`, `proto`), many requests in flight
//! on 1-4 connections, replies received by the callers themselves and a
//! watcher thread each for reconnects (`conn`), one caller's many requests
//! in flight at once (`batch`: pageout's write runs, windows of reads), and
//! trims of freed slots (`trim`).
//!
//! Layout on the export: page 0 is the header (a magic, a random epoch made at
//! `swapon`, the swap size), slot `s` is at `4096 * (s + 1)`. Slots go to
//! connection `(s / 512) % n`, so one slot's reads, writes and trims always
//! share one connection and its ordering (and a trim's reply comes before a
//! later write of its slot is sent).
//!
//! Failure rules: every request has a deadline; an error reply fails that
//! request (the swap layer keeps a page whose write failed, and keeps the slot
//! of a read that failed); a cut connection reconnects in the background with
//! backoff, re-sends the reads that were in flight and fails the writes;
//! every reconnect reads the header back, and a different epoch (a server
//! that restarted and lost its memory) makes every later request fail: no
//! slot of a lost server ever reads as data. The per-slot checksums of
//! `page_io` catch the rest.
//!
//! Invariants: all request slots, iovec arrays and buffers exist from
//! `swapon` on; the read and write paths allocate nothing. Locking: see
//! `conn` and `trim`; this file holds none of its own.

mod batch;
pub use batch::NBD_READ_DEPTH_MAX;
mod conn;
mod proto;
mod reader;
mod rx;
mod trim;
mod uri;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) use conn::Ticket;
use conn::{Client, NR_SLOTS};
use proto::{ExportInfo, CMD_READ, CMD_WRITE};
use reader::sync_io;
use trim::TrimState;
use uri::NbdUri;

use crate::page_io::SwapBackend;

const PAGE: u64 = 4096;
/// Slots per connection stripe (one 2 MiB swap cluster).
const STRIPE: u64 = 512;
/// Connections at most.
pub const NBD_MAX_CONNECTIONS: usize = 4;
/// Writes one caller has in flight at most (below a connection's request
/// slots, so a batch never holds all of them).
const WRITE_BATCH: usize = NR_SLOTS / 2;
/// The default deadline of a request.
pub const NBD_DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const HEADER_MAGIC: &[u8; 16] = b"mmkit-nbd-swap-1";
/// Tries of a header request that the server answers with an error.
const HEADER_TRIES: usize = 4;

/// How to open an NBD swap device.
#[derive(Clone, Debug)]
pub(crate) struct NbdOptions {
    pub(crate) timeout: Duration,
    /// 0: as many as the server allows, up to 4 and the CPUs.
    pub(crate) connections: usize,
}

impl Default for NbdOptions {
    fn default() -> NbdOptions {
        NbdOptions {
            timeout: NBD_DEFAULT_TIMEOUT,
            connections: 0,
        }
    }
}

/// What an NBD device did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NbdStats {
    /// Connections.
    pub connections: usize,
    /// Reconnects after a cut connection.
    pub reconnects: u64,
    /// Reads sent again after a reconnect.
    pub resent: u64,
    /// Requests past their deadline.
    pub timeouts: u64,
    /// Error replies from the server.
    pub error_replies: u64,
    /// Slots trimmed.
    pub trimmed: u64,
    /// The server lost its memory (restarted): every request fails.
    pub lost: bool,
    /// Structured replies were negotiated (at `swapon`).
    pub structured: bool,
}

/// A swap device on an NBD export, as [`crate::SwapDevice::nbd`] turns it on;
/// usable on its own as a [`SwapBackend`] over `bytes` (offsets relative to
/// the swap area, after the export's header page).
pub struct NbdBackend {
    cl: Arc<Client>,
    trim: Option<Arc<TrimState>>,
    /// The trimmer thread (with `trim`), joined first on drop.
    trimmer: Option<JoinHandle<()>>,
    /// One watcher per connection.
    threads: Vec<JoinHandle<()>>,
    nr_slots: u32,
    structured: bool,
}

/// The checks of every connection: writable, big enough, 4 KiB blocks.
pub(crate) fn check_export(info: &ExportInfo, need: u64) -> io::Result<()> {
    if info.flags & proto::TFLAG_READ_ONLY != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "NBD export is read-only",
        ));
    }
    if info.size < need {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "NBD export of {} bytes is smaller than the swap area plus its 4 KiB header \
                 page ({need} bytes)",
                info.size
            ),
        ));
    }
    if info.min_block > PAGE as u32 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "NBD export's minimum block size {} is above the 4096-byte page",
                info.min_block
            ),
        ));
    }
    Ok(())
}

fn random_epoch() -> [u8; 16] {
    let mut e = [0u8; 16];
    // SAFETY: getrandom writes at most 16 bytes into `e`.
    let n = unsafe { libc::getrandom(e.as_mut_ptr().cast(), e.len(), 0) };
    if n != 16 {
        // Time and pid: distinct across restarts, which is all the epoch needs.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        e[..8].copy_from_slice(&t.to_le_bytes());
        e[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    e
}

impl NbdBackend {
    /// Connects to `uri` for a swap area of `bytes` (a multiple of 4096):
    /// the export needs `bytes + 4096`. Errors: a bad or unsupported URI, an
    /// unreachable server, a read-only or too small export, a minimum block
    /// size above 4096.
    pub fn connect(uri: &str, bytes: u64) -> io::Result<NbdBackend> {
        Self::open(uri, bytes, &NbdOptions::default())
    }

    pub(crate) fn open(uri: &str, bytes: u64, opts: &NbdOptions) -> io::Result<NbdBackend> {
        let uri = NbdUri::parse(uri)?;
        if bytes == 0 || !bytes.is_multiple_of(PAGE) || bytes / PAGE > u32::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NBD swap size {bytes}: not a positive multiple of 4096 below 16 TiB"),
            ));
        }
        let need = bytes + PAGE;
        // Connecting, negotiating and the header page get at least the default
        // deadline, whatever the requests' own.
        let setup = opts.timeout.max(NBD_DEFAULT_TIMEOUT);
        let first = proto::handshake(proto::connect(&uri.target, setup)?, &uri)?;
        check_export(&first.1, need)?;
        let info = first.1;
        let max_conns = if info.flags & proto::TFLAG_CAN_MULTI_CONN != 0 {
            NBD_MAX_CONNECTIONS
        } else {
            1
        };
        let want = match opts.connections {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let nconns = want.clamp(1, max_conns);
        let mut links = vec![first];
        while links.len() < nconns {
            let l = proto::handshake(proto::connect(&uri.target, setup)?, &uri)?;
            check_export(&l.1, need)?;
            links.push(l);
        }
        let mut cl = Client::new(uri, need, opts.timeout, nconns);
        cl.header[..16].copy_from_slice(HEADER_MAGIC);
        cl.header[16..32].copy_from_slice(&random_epoch());
        cl.header[32..40].copy_from_slice(&bytes.to_le_bytes());
        Self::write_header(&cl.header, &links)?;
        for (fd, _) in &links {
            proto::set_rx_tick(fd, conn::RX_TICK)?;
        }
        let trim = (info.flags & proto::TFLAG_SEND_TRIM != 0)
            .then(|| Arc::new(TrimState::new((bytes / PAGE) as u32)));
        let cl = Arc::new(cl);
        let mut threads = Vec::new();
        for (ci, link) in links.into_iter().enumerate() {
            let c = cl.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("nbd-watch/{ci}"))
                    .spawn(move || c.watcher(ci, link))?,
            );
        }
        let mut dev = NbdBackend {
            cl,
            trim: None,
            trimmer: None,
            threads,
            nr_slots: (bytes / PAGE) as u32,
            structured: info.structured,
        };
        if let Some(t) = trim {
            let (c, t2) = (dev.cl.clone(), t.clone());
            let n = dev.cl.conns.len() as u64;
            dev.trimmer = Some(std::thread::Builder::new().name("nbd-trim".into()).spawn(
                move || {
                    t2.run(|slot, run| {
                        let ci = ((slot as u64 / STRIPE) % n) as usize;
                        let off = (slot as u64 + 1) * PAGE;
                        let _ = c.trim(ci, off, run * PAGE as u32);
                    })
                },
            )?);
            dev.trim = Some(t);
        }
        Ok(dev)
    }

    /// Writes the header page through the first connection and reads it back
    /// through every one (each must see the same export).
    fn write_header(header: &[u8; 40], links: &[(OwnedFd, ExportInfo)]) -> io::Result<()> {
        let mut page = vec![0u8; PAGE as usize];
        let mut scratch = vec![0u8; 64 << 10];
        page[..40].copy_from_slice(header);
        // An error reply (a flaky server) is tried again a few times.
        let mut io = |fd: RawFd, cmd, data: &mut [u8]| {
            let mut r = Ok(());
            for _ in 0..HEADER_TRIES {
                r = sync_io(fd, cmd, 0, data, &mut scratch)?;
                if r.is_ok() {
                    break;
                }
            }
            r
        };
        io(links[0].0.as_raw_fd(), CMD_WRITE, &mut page)?;
        for (fd, _) in links {
            let mut back = vec![0u8; PAGE as usize];
            io(fd.as_raw_fd(), CMD_READ, &mut back)?;
            if back[..40] != header[..] {
                return Err(io::Error::other(
                    "NBD export does not read back the header page just written",
                ));
            }
        }
        Ok(())
    }

    fn conn_of(&self, slot: u64) -> usize {
        ((slot / STRIPE) % self.cl.conns.len() as u64) as usize
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        let len = len as u64;
        if !offset.is_multiple_of(PAGE)
            || !len.is_multiple_of(PAGE)
            || offset
                .checked_add(len)
                .is_none_or(|e| e > self.nr_slots as u64 * PAGE)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NBD swap I/O at {offset:#x} (+{len:#x}) is unaligned or outside"),
            ));
        }
        if self.cl.lost.load(Ordering::Acquire) {
            return Err(conn::lost_err());
        }
        Ok(())
    }

    /// Writes runs of pages from swap-area offset `offset` on: one request per
    /// stripe-contiguous group of up to 256 pages, all sent before any reply
    /// is waited for.
    pub(crate) fn write_pages(&self, offset: u64, pages: &[&[u8]]) -> io::Result<()> {
        self.check(offset, pages.len() * PAGE as usize)?;
        let mut err = None;
        self.write_runs(&[((offset / PAGE) as u32, pages)], &mut |_, e| {
            err.get_or_insert(e);
        });
        err.map_or(Ok(()), Err)
    }

    /// Sends the read of one page at swap-area offset `offset` into `buf`
    /// and returns without waiting: the ticket to [`NbdBackend::read_complete`].
    /// `block`: wait for a free request slot (else `WouldBlock`).
    ///
    /// # Safety
    /// `buf` is valid for writes of 4096 bytes, and nothing else accesses it,
    /// until the ticket is completed.
    pub(crate) unsafe fn read_submit(
        &self,
        offset: u64,
        buf: *mut u8,
        block: bool,
    ) -> io::Result<Ticket> {
        self.check(offset, PAGE as usize)?;
        let slot = offset / PAGE;
        // SAFETY: the caller's contract.
        unsafe {
            self.cl.submit_read(
                self.conn_of(slot),
                (slot + 1) * PAGE,
                buf,
                PAGE as usize,
                block,
            )
        }
    }

    /// Waits for a read sent by [`NbdBackend::read_submit`].
    pub(crate) fn read_complete(&self, t: Ticket) -> io::Result<()> {
        self.cl.complete(t)
    }

    /// A freed slot: trimmed on the server soon (where it supports TRIM).
    pub(crate) fn discard(&self, slot: u32) {
        if let Some(t) = &self.trim {
            if slot < self.nr_slots {
                t.mark(slot);
            }
        }
    }

    /// The counters.
    pub fn stats(&self) -> NbdStats {
        let c = &self.cl.counters;
        NbdStats {
            connections: self.cl.conns.len(),
            reconnects: c.reconnects.load(Ordering::Relaxed),
            resent: c.resent.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            error_replies: c.error_replies.load(Ordering::Relaxed),
            trimmed: self
                .trim
                .as_ref()
                .map_or(0, |t| t.trimmed.load(Ordering::Relaxed)),
            lost: self.cl.lost.load(Ordering::Acquire),
            structured: self.structured,
        }
    }

    /// Does the server take trims?
    pub fn can_trim(&self) -> bool {
        self.trim.is_some()
    }
}

impl SwapBackend for NbdBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut at = 0usize;
        while at < buf.len() {
            let slot = (offset + at as u64) / PAGE;
            let to_stripe = ((STRIPE - slot % STRIPE) * PAGE) as usize;
            let n = (buf.len() - at).min(to_stripe).min(1 << 20);
            self.cl
                .read(self.conn_of(slot), (slot + 1) * PAGE, &mut buf[at..at + n])?;
            at += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut pages = [&[][..]; 16];
        for chunk in buf.chunks(16 * PAGE as usize).enumerate() {
            let (k, chunk) = chunk;
            let n = chunk.len().div_ceil(PAGE as usize);
            for (p, c) in pages.iter_mut().zip(chunk.chunks(PAGE as usize)) {
                *p = c;
            }
            self.write_pages(offset + (k * 16) as u64 * PAGE, &pages[..n])?;
        }
        Ok(())
    }
}

impl crate::SwapDevice {
    /// An NBD device: the deadline of each request (default 5 s; connecting,
    /// negotiating and the header page get at least 5 s).
    pub fn nbd_timeout(mut self, timeout: Duration) -> crate::SwapDevice {
        if let Some(o) = self.nbd_options() {
            o.timeout = timeout;
        }
        self
    }
    /// An NBD device: connections to use (1 to 4; more than one only where
    /// the server allows multiple connections). Default: up to the CPUs.
    pub fn nbd_connections(mut self, n: usize) -> crate::SwapDevice {
        if let Some(o) = self.nbd_options() {
            o.connections = n.clamp(1, NBD_MAX_CONNECTIONS);
        }
        self
    }
}

impl crate::Mm {
    /// The counters of NBD swap device `id` (`None` for another kind of
    /// device, or one that is not on).
    pub fn nbd_stats(&self, id: crate::SwapId) -> Option<NbdStats> {
        self.swap()
            .with_backend(id, |b| match b {
                crate::page_io::Backend::Nbd(d) => Some(d.stats()),
                _ => None,
            })
            .flatten()
    }
}

impl Drop for NbdBackend {
    fn drop(&mut self) {
        // The trimmer waits for each trim's reply (each has a deadline): joined
        // before the disconnect, no trim is in flight when the sockets close,
        // and the server never writes a reply into a closed connection.
        if let Some(t) = &self.trim {
            t.stop();
        }
        if let Some(t) = self.trimmer.take() {
            let _ = t.join();
        }
        self.cl.shutdown_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
