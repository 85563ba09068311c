//! Swap devices (Linux's `mm/swapfile.c`, the `swap_info` half): what `/proc/swaps`
//! shows ([`SwapInfo`]) of a device a user asked for ([`SwapDevice`], built in
//! `swapon.rs`), and the set of devices that are on ([`SwapDevices`]): `swapon`
//! with its validation, `swapoff`, slot allocation across devices by priority,
//! and the device an entry names ([`SwapDevices::get`], Linux's
//! `get_swap_device`): a [`DeviceRef`] that pins it, on which the per-slot
//! operations run (`swap_device.rs`). Nothing here
//! routes an entry: a path looks its device up once per operation, or once per
//! device for a batch ([`SwapPins`]).
//!
//! A swap entry is [`crate::pgtable::SwapEntry`]: `ty` is the device's type (its
//! index in the set, `0..=SwapEntry::MAX_TYPE`), `offset` its slot.
//!
//! Order of use (Linux's): devices of higher priority first; among devices of one
//! priority, round robin; a device that is full is skipped. Priorities given by
//! the user are `0..=32767`; devices without one get -2, -3, ... in `swapon`
//! order, like Linux's `least_priority`.
//!
//! Invariants: `swapon` validates everything (size, priority, path, duplicate
//! file, free type) before it creates anything, and removes a file it created if
//! a later step fails: a refused call changes nothing. `swapoff` refuses a device
//! with slots in use (`Mm::swapoff` brings the pages back first: `unuse` in
//! `space/swap.rs`). A [`SwapId`]
//! carries a generation, so an id of a device that went off names nothing, even
//! after its type is reused. A [`DeviceRef`] keeps its device alive after
//! `swapoff` took it out of the table (see `swap_device.rs`). [`SwapTotals`]
//! keeps the slot and cache counts over all devices, so a swap-in's policy
//! question (`should_free_swap`) reads no table.
//!
//! Locking: the table of devices is a `ShardedLock` (per-thread read shards, so
//! the allocation and fault paths scale), written by `swapon`/`swapoff`, which
//! are serialized by `swapon_mutex`; `writeok` and `on` of a device are written
//! under the table's write lock and read without it. Each device's own locks
//! are described in `swap_cluster/` (map, clusters), `swap_state.rs` (cache),
//! `page_io/` (I/O).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard};
use mmkit_core::{LockStats, PAGE_SIZE};

use crate::error::setup_err;
pub(crate) use crate::error::SwapError;
use crate::nbd::NbdBackend;
use crate::page_io::{Backend, FileDevice, RamDevice, SwapIo, SwapIoStats};
use crate::pgtable::SwapEntry;
use crate::swap_cluster::{SwapAllocPolicy, SwapMap, SWAPFILE_CLUSTER};
pub(crate) use crate::swap_device::{DeviceRef, SwapPins, SwapTotals};
use crate::swap_readahead::{SwapRa, SwapReadahead};
use crate::swap_state::{SwapCache, SwapCacheIndex};
use crate::swapon::{Source, SwapDevice};
use crate::{Error, Mm};

/// Highest priority a user may give (Linux's `SWAP_FLAG_PRIO_MASK`).
pub const SWAP_PRIO_MAX: i32 = 32767;
/// The most devices on at once (types `0..=SwapEntry::MAX_TYPE`).
pub const MAX_SWAPFILES: usize = SwapEntry::MAX_TYPE as usize + 1;
/// Smallest device: one cluster (2 MiB).
pub const SWAP_MIN_BYTES: u64 = SWAPFILE_CLUSTER as u64 * PAGE_SIZE as u64;

/// A device that is on: its type (the `ty` of its swap entries) and a generation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SwapId {
    ty: u32,
    gen: u32,
}

impl SwapId {
    /// The swap type: the `ty` of this device's swap entries.
    pub fn swap_type(self) -> u32 {
        self.ty
    }
}

/// What backs a device (`/proc/swaps`' Type column).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SwapKind {
    /// Anonymous memory.
    Ram,
    /// A file.
    File,
    /// A user backend.
    Backend,
    /// An NBD export.
    Nbd,
}

/// One device as `/proc/swaps` shows it, and its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwapInfo {
    /// The device.
    pub id: SwapId,
    /// Slots (pages) of the device.
    pub size_pages: u64,
    /// Slots in use.
    pub used_pages: u64,
    /// Its priority (higher is used first).
    pub priority: i32,
    /// The file's path, or `[ram]` / `[backend]`.
    pub filename: String,
    pub kind: SwapKind,
    /// Pages in this device's swap cache.
    pub cached_pages: u64,
    /// A file opened with `O_DIRECT`.
    pub direct_io: bool,
    /// A file whose I/O goes through `io_uring`.
    pub io_uring: bool,
    /// Pages read and verified (`pswpin`).
    pub pswpin: u64,
    /// Pages written (`pswpout`).
    pub pswpout: u64,
    /// Failed reads and writes.
    pub io_errors: u64,
    /// Reads refused for a checksum mismatch.
    pub checksum_errors: u64,
}

/// What `validate` found: the free type, the file's (st_dev, st_ino) and whether
/// it existed.
type Validated = (u32, Option<(u64, u64)>, bool);

/// One device that is on (Linux's `swap_info_struct`).
pub(crate) struct SwapInfoStruct {
    pub(crate) id: SwapId,
    prio: i32,
    kind: SwapKind,
    name: String,
    /// (st_dev, st_ino) of a file device.
    file_id: Option<(u64, u64)>,
    pub(crate) map: SwapMap,
    pub(crate) cache: SwapCache,
    pub(crate) io: SwapIo,
    /// (T) Takes allocations (Linux's `SWP_WRITEOK`): false once `swapoff`
    /// began. (Locking letters: see `rmap.rs`.)
    pub(crate) writeok: AtomicBool,
    /// (T) In the table (false once `swapoff` removed it).
    pub(crate) on: AtomicBool,
    pub(crate) totals: Arc<SwapTotals>,
    /// (A) Per slot: the memory cgroup charged for it (0: the root).
    pub(crate) memcg_owner: Box<[std::sync::atomic::AtomicU16]>,
}

impl SwapInfoStruct {
    fn info(&self) -> SwapInfo {
        let SwapIoStats {
            pswpin,
            pswpout,
            io_errors,
            checksum_errors,
        } = self.io.stats();
        let (direct_io, io_uring) = match self.io.backend() {
            Backend::File(f) => (f.is_direct(), f.uses_io_uring()),
            _ => (false, false),
        };
        SwapInfo {
            id: self.id,
            size_pages: self.map.nr_slots() as u64,
            used_pages: self.map.inuse(),
            priority: self.prio,
            filename: self.name.clone(),
            kind: self.kind,
            cached_pages: self.cache.nr_cached(),
            direct_io,
            io_uring,
            pswpin,
            pswpout,
            io_errors,
            checksum_errors,
        }
    }
}

#[derive(Default)]
struct Table {
    by_type: Vec<Option<Arc<SwapInfoStruct>>>,
    /// Devices by priority, highest first, `swapon` order among equals.
    avail: Vec<Arc<SwapInfoStruct>>,
    least_priority: i32,
    gen: u32,
}

/// When a page read back from swap gives up its slot (Linux's
/// `should_try_to_free_swap`). A page that keeps its slot stays in the swap
/// cache: while it is not written, reclaim drops it again without a write (and
/// without a checksum), which for a read-mostly working set is most of the
/// swap-out work. A write, or `swapoff`, always frees the slot.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SwapFreePolicy {
    /// Linux: a read fault keeps the slot only while at most half of all swap
    /// is in use (`vm_swap_full`); on a nearly full device every swap-in frees
    /// its slot and every swap-out writes again.
    HalfFull,
    /// mmkit: keep the slot while the free slots still cover every resident
    /// page that has none (the most that reclaim could ever need), plus a
    /// reserve of a 32nd of the devices. Whatever the device's fill, a page
    /// that was only read goes out again for free.
    #[default]
    KeepWhileRoom,
}

/// The devices that are on, and the policies new devices get.
pub(crate) struct SwapDevices {
    totals: Arc<SwapTotals>,
    alloc: SwapAllocPolicy,
    index: SwapCacheIndex,
    free_policy: SwapFreePolicy,
    ra: SwapRa,
    nr_cpus: usize,
    table: ShardedLock<Table>,
    swapon_mutex: Mutex<()>,
    rr: AtomicUsize,
    /// Reads of `table` (a debug count: how often a path looks a device up).
    #[cfg(test)]
    table_reads: std::sync::atomic::AtomicU64,
}

impl SwapDevices {
    pub(crate) fn new(
        alloc: SwapAllocPolicy,
        index: SwapCacheIndex,
        free_policy: SwapFreePolicy,
        ra: SwapReadahead,
        nr_cpus: usize,
    ) -> SwapDevices {
        SwapDevices {
            totals: Arc::new(SwapTotals::new(nr_cpus)),
            alloc,
            index,
            free_policy,
            ra: SwapRa::new(ra, nr_cpus),
            nr_cpus,
            table: ShardedLock::new(Table {
                least_priority: -1,
                ..Table::default()
            }),
            swapon_mutex: Mutex::new(()),
            rr: AtomicUsize::new(0),
            #[cfg(test)]
            table_reads: Default::default(),
        }
    }

    /// Lets freed slots uncharge their memory cgroups (set once, at build).
    pub(crate) fn set_memcg(&self, t: Arc<crate::memcontrol::MemCgTable>) {
        let _ = self.totals.memcg.set(t);
    }

    /// Reads the device table (counted in tests: see `table_reads`).
    fn read_table(&self) -> ShardedLockReadGuard<'_, Table> {
        #[cfg(test)]
        self.table_reads.fetch_add(1, Ordering::Relaxed);
        self.table.read().unwrap()
    }

    /// How many times the device table was read.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn table_reads(&self) -> u64 {
        self.table_reads.load(Ordering::Relaxed)
    }

    fn validate(&self, t: &Table, dev: &SwapDevice) -> Result<Validated, SwapError> {
        let bytes = dev.bytes;
        let bad = |reason: &str| SwapError::BadSize {
            bytes,
            reason: reason.to_string(),
        };
        if !bytes.is_multiple_of(PAGE_SIZE as u64) {
            return Err(bad("not a multiple of the 4096-byte page size"));
        }
        if bytes < SWAP_MIN_BYTES {
            return Err(bad("smaller than one 2 MiB swap cluster"));
        }
        let pages = bytes / PAGE_SIZE as u64;
        if pages > u32::MAX as u64 - 1 || pages > SwapEntry::MAX_OFFSET || bytes > isize::MAX as u64
        {
            return Err(bad("larger than 16 TiB"));
        }
        if let Some(p) = dev.priority {
            if !(0..=SWAP_PRIO_MAX).contains(&p) {
                return Err(SwapError::BadPriority { priority: p });
            }
        }
        let mut file_id = None;
        let mut exists = false;
        if let Source::File(path) = &dev.source {
            let bad_path = |reason: &str| SwapError::BadPath {
                path: path.clone(),
                reason: reason.to_string(),
            };
            if path.as_os_str().is_empty() {
                return Err(bad_path("empty path"));
            }
            match std::fs::metadata(path) {
                Ok(md) => {
                    if md.is_dir() {
                        return Err(bad_path("is a directory"));
                    }
                    if !md.is_file() {
                        return Err(bad_path("not a regular file"));
                    }
                    let id = (md.dev(), md.ino());
                    if let Some(on) = t.by_type.iter().flatten().find(|d| d.file_id == Some(id)) {
                        return Err(SwapError::DuplicateFile {
                            path: path.clone(),
                            id: on.id,
                        });
                    }
                    if md.len() != 0 && md.len() != bytes {
                        return Err(bad_path(&format!(
                            "exists with {} bytes, not {bytes}; remove it or give its size",
                            md.len()
                        )));
                    }
                    file_id = Some(id);
                    exists = true;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
                    if parent.is_some_and(|p| !p.is_dir()) {
                        return Err(bad_path("its directory does not exist"));
                    }
                }
                Err(e) => return Err(bad_path(&e.to_string())),
            }
        }
        let ty = match t.by_type.iter().position(Option::is_none) {
            Some(i) => i,
            None if t.by_type.len() < MAX_SWAPFILES => t.by_type.len(),
            None => return Err(SwapError::TooManyDevices),
        };
        Ok((ty as u32, file_id, exists))
    }

    /// Turns a device on (Linux's `swapon`).
    pub(crate) fn swapon(&self, dev: SwapDevice) -> Result<SwapId, SwapError> {
        let _serial = self.swapon_mutex.lock().unwrap_or_else(|e| e.into_inner());
        let (ty, mut file_id, existed) = self.validate(&self.read_table(), &dev)?;
        let nr_slots = (dev.bytes / PAGE_SIZE as u64) as u32;
        let (backend, kind, name) = match dev.source {
            Source::Ram => (
                Backend::Ram(RamDevice::new(dev.bytes, dev.populate).map_err(setup_err)?),
                SwapKind::Ram,
                "[ram]".into(),
            ),
            Source::Backend(b) => (Backend::User(b), SwapKind::Backend, "[backend]".into()),
            Source::Nbd(uri, o) => {
                let d = NbdBackend::open(&uri, dev.bytes, &o).map_err(setup_err)?;
                (Backend::Nbd(d), SwapKind::Nbd, uri)
            }
            Source::File(path) => {
                let opened =
                    FileDevice::open(&path, dev.bytes, dev.direct, dev.engine).and_then(|f| {
                        let md = std::fs::metadata(&path)?;
                        Ok((f, (md.dev(), md.ino())))
                    });
                match opened {
                    Ok((f, id)) => {
                        file_id = Some(id);
                        (Backend::File(f), SwapKind::File, path.display().to_string())
                    }
                    Err(e) => {
                        if !existed {
                            let _ = std::fs::remove_file(&path);
                        }
                        return Err(setup_err(e));
                    }
                }
            }
        };
        let mut t = self.table.write().unwrap();
        let prio = match dev.priority {
            Some(p) => p,
            None => {
                t.least_priority -= 1;
                t.least_priority
            }
        };
        t.gen = t.gen.wrapping_add(1);
        let id = SwapId { ty, gen: t.gen };
        let seed = (t.gen as u64) << 32 | ty as u64;
        let si = Arc::new(SwapInfoStruct {
            id,
            prio,
            kind,
            name,
            file_id,
            map: SwapMap::new(nr_slots, self.alloc, self.nr_cpus, seed),
            cache: SwapCache::new(self.index, nr_slots),
            io: SwapIo::new(backend, nr_slots),
            writeok: AtomicBool::new(true),
            on: AtomicBool::new(true),
            totals: self.totals.clone(),
            memcg_owner: (0..nr_slots)
                .map(|_| std::sync::atomic::AtomicU16::new(0))
                .collect(),
        });
        self.totals
            .total
            .fetch_add(nr_slots as u64, Ordering::Relaxed);
        if t.by_type.len() == ty as usize {
            t.by_type.push(None);
        }
        t.by_type[ty as usize] = Some(si.clone());
        let at = t
            .avail
            .iter()
            .position(|d| d.prio < prio)
            .unwrap_or(t.avail.len());
        t.avail.insert(at, si);
        Ok(id)
    }

    /// Turns a device off (Linux's `swapoff`); refused while slots are in use.
    pub(crate) fn swapoff(&self, id: SwapId) -> Result<(), SwapError> {
        let _serial = self.swapon_mutex.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = self.table.write().unwrap();
        let si = match t.by_type.get(id.ty as usize) {
            Some(Some(si)) if si.id == id => si.clone(),
            _ => return Err(SwapError::NoSuchDevice { id }),
        };
        let used = si.map.inuse();
        if used != 0 {
            return Err(SwapError::Busy {
                id,
                used_pages: used,
            });
        }
        t.by_type[id.ty as usize] = None;
        t.avail.retain(|d| d.id != id);
        // Closing now, if it was not, and out of the table.
        self.totals.set_writeok(&si, false);
        self.totals.closing.fetch_sub(1, Ordering::Relaxed);
        si.on.store(false, Ordering::Release);
        let n = si.map.nr_slots() as u64;
        self.totals.total.fetch_sub(n, Ordering::Relaxed);
        Ok(())
    }

    /// Takes a device out of slot allocation (`swapoff`'s first step, Linux's
    /// `del_from_avail_list`) or puts it back (`on`); returns its slots in use.
    pub(crate) fn set_allocatable(&self, id: SwapId, on: bool) -> Result<u64, SwapError> {
        let mut t = self.table.write().unwrap();
        let si = match t.by_type.get(id.ty as usize) {
            Some(Some(si)) if si.id == id => si.clone(),
            _ => return Err(SwapError::NoSuchDevice { id }),
        };
        t.avail.retain(|d| d.id != id);
        self.totals.set_writeok(&si, on);
        if on {
            let at = t
                .avail
                .iter()
                .position(|d| d.prio < si.prio)
                .unwrap_or(t.avail.len());
            t.avail.insert(at, si.clone());
        }
        Ok(si.map.inuse())
    }

    /// The readahead policy and state.
    pub(crate) fn ra(&self) -> &SwapRa {
        &self.ra
    }

    /// Should a page just read back from a slot of `dev` free it (a read
    /// fault; `resident` is the arena's pages in use)? Always when the device
    /// is being swapped off; otherwise as [`SwapFreePolicy`] says, from the
    /// [`SwapTotals`]: no read of the device table.
    pub(crate) fn should_free_swap(&self, dev: &SwapInfoStruct, resident: u64) -> bool {
        if !dev.writeok() {
            return true;
        }
        let (total, free, cached) = self.totals.read();
        match self.free_policy {
            // Linux's `vm_swap_full`: more than half of all swap in use.
            SwapFreePolicy::HalfFull => free * 2 < total,
            // Resident pages that have no slot: all in use but those in the
            // swap cache (page tables count too: an overestimate, safe).
            SwapFreePolicy::KeepWhileRoom => free < resident.saturating_sub(cached) + total / 32,
        }
    }

    /// Runs `f` on the device behind `id`, if it is on.
    pub(crate) fn with_backend<R>(&self, id: SwapId, f: impl FnOnce(&Backend) -> R) -> Option<R> {
        let t = self.table.read().unwrap();
        let si = t
            .by_type
            .get(id.ty as usize)?
            .as_ref()
            .filter(|si| si.id == id)?;
        Some(f(si.io.backend()))
    }

    /// Pages in the swap caches of all devices (`SwapCached`), from the
    /// [`SwapTotals`].
    pub(crate) fn nr_cached(&self) -> u64 {
        self.totals.read().2
    }

    /// Free slots on the devices that take allocations: from the
    /// [`SwapTotals`] unless a `swapoff` is under way.
    pub(crate) fn nr_free_allocatable(&self) -> u64 {
        if self.totals.closing.load(Ordering::Relaxed) == 0 {
            return self.totals.read().1;
        }
        let t = self.read_table();
        t.avail
            .iter()
            .map(|si| (si.map.nr_slots() as u64).saturating_sub(si.map.inuse()))
            .sum()
    }

    /// Allocates up to `n` slots for CPU `cpu`, all on one device, the first in
    /// priority order (round robin among equals) that has free slots; appends
    /// them to `out` (each with its swap-cache reference) and returns the
    /// device, pinned; `None` when no device had a free slot.
    pub(crate) fn get_swap_pages(
        &self,
        cpu: usize,
        n: usize,
        out: &mut Vec<SwapEntry>,
    ) -> Option<DeviceRef> {
        let t = self.read_table();
        let mut slots = Vec::with_capacity(n);
        let mut i = 0;
        while i < t.avail.len() {
            let prio = t.avail[i].prio;
            let group = t.avail[i..].iter().take_while(|d| d.prio == prio).count();
            let start = if group > 1 {
                self.rr.fetch_add(1, Ordering::Relaxed)
            } else {
                0
            };
            for k in 0..group {
                let si = &t.avail[i + (start + k) % group];
                if si.map.get_swap_pages(cpu, n, &mut slots) > 0 {
                    let ty = si.id.ty;
                    self.totals.slots(slots.len() as i64);
                    out.extend(
                        slots
                            .iter()
                            .map(|&s| SwapEntry::new(ty, s as u64).expect("type and slot fit")),
                    );
                    return Some(DeviceRef(si.clone()));
                }
            }
            i += group;
        }
        None
    }

    /// The device `entry` names, pinned (Linux's `get_swap_device`): one read
    /// of the table. `None` when no device of its type is on or the offset is
    /// past its end; the caller knows whether that is a race it lost (its
    /// entry changed meanwhile) or a bad entry ([`Mm::swap_bad_entry`]).
    pub(crate) fn get(&self, entry: SwapEntry) -> Option<DeviceRef> {
        let t = self.read_table();
        match t.by_type.get(entry.ty() as usize) {
            Some(Some(si)) if entry.offset() < si.map.nr_slots() as u64 => {
                Some(DeviceRef(si.clone()))
            }
            _ => None,
        }
    }

    /// The devices that are on, by type.
    pub(crate) fn swap_info(&self) -> Vec<SwapInfo> {
        self.read_table()
            .by_type
            .iter()
            .flatten()
            .map(|si| si.info())
            .collect()
    }

    /// `/proc/swaps`.
    pub(crate) fn proc_swaps(&self) -> String {
        crate::views::proc_swaps(&self.swap_info())
    }

    /// Swap pages in total, and free (for `SwapTotal` / `SwapFree`).
    pub(crate) fn nr_swap_pages(&self) -> (u64, u64) {
        let t = self.read_table();
        t.by_type
            .iter()
            .flatten()
            .fold((0, 0), |(total, free), si| {
                let n = si.map.nr_slots() as u64;
                (total + n, free + n - si.map.inuse().min(n))
            })
    }

    /// Lock statistics summed over the devices: (device locks, cluster locks,
    /// swap-cache trunk locks).
    pub(crate) fn lock_stats(&self) -> (LockStats, LockStats, LockStats) {
        let t = self.read_table();
        let mut out = (
            LockStats::default(),
            LockStats::default(),
            LockStats::default(),
        );
        for si in t.by_type.iter().flatten() {
            for (acc, s) in [
                (&mut out.0, si.map.device_lock_stats()),
                (&mut out.1, si.map.cluster_lock_stats()),
                (&mut out.2, si.cache.trunk_lock_stats()),
            ] {
                acc.acquisitions += s.acquisitions;
                acc.contended += s.contended;
                acc.wait_ns += s.wait_ns;
            }
        }
        out
    }

    /// Verifies every device's map (call it quiet).
    pub(crate) fn check(&self) -> Result<(), String> {
        let t = self.read_table();
        let (mut total, mut free, mut cached) = (0, 0, 0);
        for si in t.by_type.iter().flatten() {
            si.map
                .check()
                .map_err(|e| format!("swap device {:?}: {e}", si.id))?;
            let n = si.map.nr_slots() as u64;
            (total, free) = (total + n, free + n - si.map.inuse().min(n));
            cached += si.cache.nr_cached();
        }
        let closing = t
            .by_type
            .iter()
            .flatten()
            .filter(|si| !si.writeok())
            .count();
        if closing != self.totals.closing.load(Ordering::Relaxed) {
            return Err(format!(
                "{closing} devices closing, the totals say otherwise"
            ));
        }
        let counted = self.totals.read();
        if counted != (total, free, cached) {
            return Err(format!(
                "swap totals (slots, free, cached) {counted:?}, the devices say {:?}",
                (total, free, cached)
            ));
        }
        Ok(())
    }
}

impl Mm {
    /// Turns a swap device on (Linux's `swapon`): from now on reclaim may write
    /// cold pages to it. Bad input (size, priority, path, duplicate file, too
    /// many devices) is refused with [`Error::Swap`] and changes nothing.
    pub fn swapon(&self, dev: SwapDevice) -> Result<SwapId, Error> {
        self.swap()
            .swapon(dev)
            .map_err(|e| Error::Swap(e.to_string()))
    }

    /// Turns a swap device off (Linux's `swapoff` with `try_to_unuse`): every
    /// page on it is brought back into memory first. Refused with
    /// [`Error::Swap`] when the id names no device that is on, or when memory
    /// (with the other devices' free slots) cannot hold the pages; then the
    /// device stays on and its pages stay where they are.
    pub fn swapoff(&self, id: SwapId) -> Result<(), Error> {
        let swap = self.swap();
        let used = swap
            .set_allocatable(id, false)
            .map_err(|e| Error::Swap(e.to_string()))?;
        // Pages kept in the swap cache are in memory already.
        let cached = swap
            .swap_info()
            .iter()
            .find(|i| i.id == id)
            .map_or(0, |i| i.cached_pages);
        let used = used.saturating_sub(cached);
        let room = self.nr_free_pages().saturating_sub(self.total_wmark_high())
            + swap.nr_free_allocatable();
        if used > room {
            let _ = swap.set_allocatable(id, true);
            return Err(Error::Swap(format!(
                "swapoff {id:?}: {used} pages in use do not fit in memory ({room} pages free \
                 above the high watermark, other devices included); free memory first"
            )));
        }
        let mut last = u64::MAX;
        loop {
            for s in self.spaces().all() {
                if let Err(e) = s.inner().unuse(id.swap_type()) {
                    let _ = swap.set_allocatable(id, true);
                    return Err(Error::Swap(format!(
                        "swapoff {id:?}: bringing pages back failed ({e}); the device stays on"
                    )));
                }
            }
            // Slots a reclaim in flight took before the device left the
            // allocation list are unmapped into PTEs by now, or freed.
            match swap.swapoff(id) {
                Ok(()) => return Ok(()),
                Err(SwapError::Busy { used_pages, .. }) if used_pages < last => {
                    last = used_pages;
                    std::thread::yield_now();
                }
                Err(e) => {
                    let _ = swap.set_allocatable(id, true);
                    return Err(Error::Swap(e.to_string()));
                }
            }
        }
    }

    /// The swap devices that are on, shaped like `/proc/swaps`.
    pub fn swap_info(&self) -> Vec<SwapInfo> {
        self.swap().swap_info()
    }

    /// `/proc/swaps` as text.
    pub fn proc_swaps(&self) -> String {
        self.swap().proc_swaps()
    }

    /// Swap lock statistics: (device locks, cluster locks, swap-cache trunk locks).
    pub fn swap_lock_stats(&self) -> (LockStats, LockStats, LockStats) {
        self.swap().lock_stats()
    }

    /// Can reclaim free anything now: a device with free slots, or pages in the
    /// swap cache (a clean one goes out without a new slot)?
    pub(crate) fn can_swap_out(&self) -> bool {
        self.swap().nr_cached() > 0 || self.swap().nr_free_allocatable() > 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
