//! What a user asks `swapon` for (the arguments of Linux's `swapon(2)`): a
//! [`SwapDevice`], built from its [`Source`] (RAM, a file, a user backend or an
//! NBD export), its size and its options. Building one checks nothing and
//! creates nothing: `SwapDevices::swapon` (`swapfile.rs`) validates it whole
//! before it turns anything on.
//!
//! Invariants: a `SwapDevice` is plain data, consumed by one `swapon`.
//! Locking: none.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::nbd::NbdOptions;
use crate::page_io::{DirectIo, IoEngine, SwapBackend};

/// What backs a device to turn on.
pub(crate) enum Source {
    Ram,
    File(PathBuf),
    Backend(Arc<dyn SwapBackend>),
    Nbd(String, NbdOptions),
}

/// A swap device to turn on: `SwapDevice::ram(bytes)`, `SwapDevice::file(path,
/// bytes)` or `SwapDevice::backend(Arc<dyn SwapBackend>, bytes)`, with an
/// optional `.priority(p)`.
pub struct SwapDevice {
    pub(crate) source: Source,
    pub(crate) bytes: u64,
    pub(crate) priority: Option<i32>,
    pub(crate) direct: DirectIo,
    pub(crate) engine: IoEngine,
    pub(crate) populate: bool,
}

impl SwapDevice {
    /// `bytes` of anonymous memory (a multiple of 4096, at least 2 MiB).
    pub fn ram(bytes: u64) -> SwapDevice {
        Self::with(Source::Ram, bytes)
    }
    /// The file at `path`, created if missing (an existing file must be a regular
    /// file of length 0 or `bytes`), sized to `bytes`.
    pub fn file(path: impl AsRef<Path>, bytes: u64) -> SwapDevice {
        Self::with(Source::File(path.as_ref().to_path_buf()), bytes)
    }
    /// A user backend holding `bytes`.
    pub fn backend(backend: Arc<dyn SwapBackend>, bytes: u64) -> SwapDevice {
        Self::with(Source::Backend(backend), bytes)
    }
    /// An NBD export (`nbd://host[:port]/export` or
    /// `nbd+unix:///export?socket=PATH`) of at least `bytes` plus a 4 KiB
    /// header page.
    pub fn nbd(uri: impl Into<String>, bytes: u64) -> SwapDevice {
        Self::with(Source::Nbd(uri.into(), NbdOptions::default()), bytes)
    }
    /// The options of an NBD device (`None` for another kind).
    pub(crate) fn nbd_options(&mut self) -> Option<&mut NbdOptions> {
        match &mut self.source {
            Source::Nbd(_, o) => Some(o),
            _ => None,
        }
    }
    fn with(source: Source, bytes: u64) -> SwapDevice {
        SwapDevice {
            source,
            bytes,
            priority: None,
            direct: DirectIo::Auto,
            engine: IoEngine::Auto,
            populate: false,
        }
    }
    /// The priority (`0..=32767`; higher is used first).
    pub fn priority(mut self, priority: i32) -> SwapDevice {
        self.priority = Some(priority);
        self
    }
    /// A file device: buffered I/O, never `O_DIRECT`.
    pub fn buffered_io(mut self) -> SwapDevice {
        self.direct = DirectIo::Never;
        self
    }
    /// A file device: `pread`/`pwrite`, never `io_uring`.
    pub fn sync_io(mut self) -> SwapDevice {
        self.engine = IoEngine::Sync;
        self
    }
    /// A RAM device: its memory is backed now (`MAP_POPULATE`, best effort),
    /// as a pmem disk's or a preallocated tmpfs file's is, instead of on the
    /// first write to each page: no host page fault on the swap-out path.
    pub fn populated(mut self) -> SwapDevice {
        self.populate = true;
        self
    }
}

impl fmt::Debug for SwapDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = match &self.source {
            Source::Ram => "ram".to_string(),
            Source::File(p) => format!("file {}", p.display()),
            Source::Backend(_) => "backend".to_string(),
            Source::Nbd(uri, _) => format!("nbd {uri}"),
        };
        f.debug_struct("SwapDevice")
            .field("source", &src)
            .field("bytes", &self.bytes)
            .field("priority", &self.priority)
            .field("populate", &self.populate)
            .finish()
    }
}
