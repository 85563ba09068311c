//! Tests of swap I/O: the RAM and file devices, batched writes, checksums, and
//! fault injection through a user backend.

use super::*;
use std::sync::atomic::AtomicBool;

fn page(tag: u8) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(31) ^ tag)
        .collect()
}

#[test]
fn ram_device_round_trip_and_bounds() {
    let d = RamDevice::new(16 * PAGE, true).unwrap();
    let p = page(1);
    d.write(3 * PAGE, &p).unwrap();
    let mut back = vec![0u8; PAGE_SIZE];
    d.read(3 * PAGE, &mut back).unwrap();
    assert_eq!(back, p);
    // Unaligned, partial, and out-of-range requests are refused.
    assert_eq!(
        d.read(1, &mut back).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        d.write(0, &p[..100]).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        d.write(16 * PAGE, &p).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        d.read(u64::MAX - 4095, &mut back).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[test]
fn swap_io_checksums_catch_corruption() {
    let io = SwapIo::new(Backend::Ram(RamDevice::new(8 * PAGE, false).unwrap()), 8);
    let mut back = vec![0u8; PAGE_SIZE];
    assert_eq!(
        io.swap_readpage(2, &mut back),
        Err(SwapIoError::NotWritten { slot: 2 })
    );
    let (a, b) = (page(7), page(8));
    io.swap_writepages(2, &[&a, &b]).unwrap();
    io.swap_readpage(3, &mut back).unwrap();
    assert_eq!(back, b);
    // Flip one bit on the device behind the checksum's back.
    let Backend::Ram(d) = io.backend() else {
        unreachable!()
    };
    let mut raw = a.clone();
    raw[100] ^= 4;
    d.write(2 * PAGE, &raw).unwrap();
    match io.swap_readpage(2, &mut back) {
        Err(SwapIoError::Corrupt {
            slot: 2,
            expected,
            found,
        }) => {
            assert_eq!(expected, crc32c::crc32c(&a));
            assert_eq!(found, crc32c::crc32c(&raw));
        }
        r => panic!("corruption not caught: {r:?}"),
    }
    io.invalidate(3);
    assert_eq!(
        io.swap_readpage(3, &mut back),
        Err(SwapIoError::NotWritten { slot: 3 })
    );
    assert_eq!(
        io.stats(),
        SwapIoStats {
            pswpin: 1,
            pswpout: 2,
            io_errors: 0,
            checksum_errors: 1
        }
    );
}

/// A backend that fails writes or reads on demand, over RAM.
pub(crate) struct Flaky {
    pub(crate) ram: RamDevice,
    pub(crate) fail_write: AtomicBool,
    pub(crate) fail_read: AtomicBool,
}

impl Flaky {
    pub(crate) fn new(size: u64) -> Flaky {
        Flaky {
            ram: RamDevice::new(size, false).unwrap(),
            fail_write: AtomicBool::new(false),
            fail_read: AtomicBool::new(false),
        }
    }
}

impl SwapBackend for Flaky {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail_read.load(Ordering::Relaxed) {
            return Err(io::Error::other("injected read error"));
        }
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.fail_write.load(Ordering::Relaxed) {
            // A torn write: garbage lands, then the device fails.
            let _ = self.ram.write(offset, &vec![0xee; buf.len()]);
            return Err(io::Error::other("injected write error"));
        }
        self.ram.write(offset, buf)
    }
}

#[test]
fn swap_io_fault_injection() {
    let flaky = Arc::new(Flaky::new(4 * PAGE));
    let io = SwapIo::new(Backend::User(flaky.clone()), 4);
    let (a, b) = (page(1), page(2));
    let mut back = vec![0u8; PAGE_SIZE];
    io.swap_writepage(0, &a).unwrap();
    // A failed write: an error, and the slot does not validate (old page gone).
    flaky.fail_write.store(true, Ordering::Relaxed);
    assert!(matches!(
        io.swap_writepage(0, &b),
        Err(SwapIoError::Io { slot: 0, .. })
    ));
    assert_eq!(
        io.swap_readpage(0, &mut back),
        Err(SwapIoError::NotWritten { slot: 0 })
    );
    flaky.fail_write.store(false, Ordering::Relaxed);
    io.swap_writepage(0, &b).unwrap();
    // A failed read, then the device heals and the same slot reads back.
    flaky.fail_read.store(true, Ordering::Relaxed);
    assert!(matches!(
        io.swap_readpage(0, &mut back),
        Err(SwapIoError::Io { slot: 0, .. })
    ));
    flaky.fail_read.store(false, Ordering::Relaxed);
    io.swap_readpage(0, &mut back).unwrap();
    assert_eq!(back, b);
    assert_eq!(io.stats().io_errors, 2);
}

fn file_round_trip(dir: &std::path::Path, direct: DirectIo, engine: IoEngine) -> (bool, bool) {
    let path = dir.join(format!("swap-{direct:?}-{engine:?}"));
    let f = FileDevice::open(&path, 64 * PAGE, direct, engine).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * PAGE);
    let io = SwapIo::new(Backend::File(f), 64);
    let pages: Vec<Vec<u8>> = (0..5).map(|i| page(i as u8)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    io.swap_writepages(10, &refs).unwrap();
    io.swap_writepage(63, &pages[4]).unwrap();
    // An unaligned caller buffer (O_DIRECT needs a bounce buffer).
    let mut big = vec![0u8; PAGE_SIZE + 1];
    for (i, p) in pages.iter().enumerate() {
        io.swap_readpage(10 + i as u32, &mut big[1..]).unwrap();
        assert_eq!(&big[1..], &p[..]);
    }
    io.swap_readpage(63, &mut big[1..]).unwrap();
    assert_eq!(&big[1..], &pages[4][..]);
    let Backend::File(f) = io.backend() else {
        unreachable!()
    };
    (f.is_direct(), f.uses_io_uring())
}

#[test]
fn file_device_direct_and_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let (direct, _) = file_round_trip(dir.path(), DirectIo::Never, IoEngine::Sync);
    assert!(!direct);
    let (_, uring) = file_round_trip(dir.path(), DirectIo::Never, IoEngine::Sync);
    assert!(!uring);
    // Whatever the filesystem and kernel offer: detected at open, same content.
    file_round_trip(dir.path(), DirectIo::Auto, IoEngine::Auto);
    file_round_trip(dir.path(), DirectIo::Auto, IoEngine::Sync);
    file_round_trip(dir.path(), DirectIo::Never, IoEngine::Auto);
    // tmpfs (O_DIRECT only on recent kernels; buffered I/O otherwise), where
    // the tester names one: the shared /dev/shm is not used, since a host whose
    // own swap sits on it can block any file creation there.
    if let Some(tmpfs) = std::env::var_os("MMKIT_TEST_TMPFS") {
        let shm = tempfile::tempdir_in(tmpfs).unwrap();
        file_round_trip(shm.path(), DirectIo::Auto, IoEngine::Auto);
        file_round_trip(shm.path(), DirectIo::Auto, IoEngine::Sync);
    }
}
