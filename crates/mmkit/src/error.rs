//! The errors of the mmkit API ([`Error`]) and the conversions from the core's
//! error types.
//!
//! Invariant: an `Err` means the call changed nothing; every message says what was
//! wrong and, where there is one, what to do about it. No state, no lock.

use std::io;
use std::path::PathBuf;

use mmkit_core::{FreeError, Pfn, MAX_ORDER};

use crate::page_io::SwapIoError;
use crate::pgtable::SwapEntry;
use crate::swap_cluster::MapError;
use crate::swap_state::CacheExists;
use crate::swapfile::{SwapId, MAX_SWAPFILES, SWAP_PRIO_MAX};

/// Errors of the mmkit API. Every refused call changed nothing.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No block of the order could be found, after draining per-CPU lists and
    /// merging; free memory or ask for a smaller order.
    #[error("out of memory: no free block of order {order} (free memory or use a smaller order)")]
    NoMemory {
        /// The requested order.
        order: u32,
    },
    /// Orders go from 0 to MAX_ORDER (10).
    #[error("invalid order {order}: orders go from 0 to {MAX_ORDER}")]
    InvalidOrder {
        /// The order given.
        order: u32,
    },
    /// The pfn is not in this Mm's arena.
    #[error("pfn {pfn} is outside the arena")]
    OutOfRange {
        /// The pfn given.
        pfn: u64,
    },
    /// The pfn is not aligned to 2^order pages, so it cannot head a block of that order.
    #[error("pfn {pfn} is not aligned to order {order}")]
    Misaligned {
        /// The pfn given.
        pfn: u64,
        /// The order given.
        order: u32,
    },
    /// The pfn is not the head of an allocated block: never allocated, already
    /// freed, or an interior page of a block.
    #[error(
        "pfn {pfn} is not an allocated block (never allocated, already freed, or inside a block)"
    )]
    NotAllocated {
        /// The pfn given.
        pfn: u64,
    },
    /// The block was allocated with another order.
    #[error("pfn {pfn} was allocated with order {allocated}, freed with order {given}")]
    WrongOrder {
        /// The pfn given.
        pfn: u64,
        /// The order it was allocated with.
        allocated: u32,
        /// The order given to free.
        given: u32,
    },
    /// The block belongs to an address space (its fault path or page table
    /// allocated it): only that space releases it, when it unmaps.
    #[error(
        "pfn {pfn} belongs to an address space (a mapped or page-table page); only blocks from alloc_pages can be freed or pinned by a caller"
    )]
    OwnedBySpace {
        /// The pfn given.
        pfn: u64,
    },
    /// The arena could not be mapped.
    #[error("arena: {0}")]
    Arena(String),
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(String),
    /// `check()` found a broken invariant.
    #[error("invariant broken: {0}")]
    Corrupt(String),
    /// An address range given to an address space was refused: zero length,
    /// unaligned, wrapping, outside `0..2^47`, or not mapped.
    #[error("bad address range {addr:#x} (+{len:#x} bytes): {reason}")]
    BadAddress {
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// `mmap` found no free range of the length in the address space; unmap
    /// something or map less.
    #[error(
        "no room for a mapping of {len} bytes in the address space (unmap something or map less)"
    )]
    AddressSpaceFull {
        /// The length asked for.
        len: u64,
    },
    /// Reading a page back from swap failed (the device refused the read): the
    /// access did nothing and the page stays on swap, so a later access retries.
    #[error("swap-in at {addr:#x} failed (swap type {swap_type}, slot {offset}): {reason}; the data stays on swap, retry the access")]
    SwapIo {
        /// The faulting address.
        addr: u64,
        /// The swap device's type.
        swap_type: u32,
        /// The slot.
        offset: u64,
        /// What the device said.
        reason: String,
    },
    /// A page read back from swap did not match the checksum written with it: it
    /// is not handed back as data (counted as `swap_checksum_fail`).
    #[error("swap-in at {addr:#x}: swap type {swap_type} slot {offset} is corrupt (CRC32C {found:#010x}, written {expected:#010x})")]
    SwapCorrupt {
        /// The faulting address.
        addr: u64,
        /// The swap device's type.
        swap_type: u32,
        /// The slot.
        offset: u64,
        /// The checksum written with the page.
        expected: u32,
        /// The checksum of what was read.
        found: u32,
    },
    /// A `swapon` or `swapoff` was refused (bad size, priority, path, duplicate
    /// file, unknown id, or not enough memory to bring the pages back); nothing
    /// changed.
    #[error("{0}")]
    Swap(String),
    /// A fault could not be handled (or an address-space call was made from inside
    /// a `with_page` closure).
    #[error("fault at {addr:#x} not handled: {reason}")]
    Fault {
        /// The faulting address.
        addr: u64,
        /// Why.
        reason: &'static str,
    },
    /// A node that this Mm does not have (`node` is `usize::MAX` when an
    /// internal request's nodemask held none of its nodes).
    #[error("node {node} does not exist: this Mm has nodes 0..{nr_nodes}")]
    BadNode {
        /// The node asked for.
        node: usize,
        /// The number of nodes.
        nr_nodes: usize,
    },
    /// A memory policy refused (a node that does not exist, an empty mask, ...).
    #[error("memory policy refused: {0}")]
    Policy(#[from] crate::mempolicy::MempolicyError),
    /// `mbind` with `STRICT`: pages of the range are not on the policy's nodes
    /// and were not moved (pinned, huge, or `MOVE` not given).
    #[error("mbind: {count} page(s) of the range are not on the policy's nodes and could not be moved (first at {first:#x}); unpin them or drop MbindFlags::STRICT")]
    Misplaced {
        /// How many pages.
        count: u64,
        /// The address of the first.
        first: u64,
    },
    /// A memory cgroup of another `Mm` was given (each `Mm` has its own tree).
    #[error("memory cgroup {group} belongs to another Mm: create spaces and children through the Mm that made it")]
    ForeignGroup {
        /// The group's id.
        group: u32,
    },
    /// The memory cgroup was removed (`MemCgroup::remove`): it takes no new
    /// settings, spaces or children.
    #[error("memory cgroup {group} has been removed: create a new group")]
    GroupRemoved {
        /// The group's id.
        group: u32,
    },
    /// The memory cgroup is in use and cannot be removed.
    #[error("memory cgroup {group} is in use ({spaces} live space(s), {children} child group(s)): drop them first")]
    GroupBusy {
        /// The group's id.
        group: u32,
        /// Its live address spaces.
        spaces: u64,
        /// Its live child groups.
        children: u64,
    },
    /// Lowering `max` below the group's usage: reclaim could not bring the
    /// usage down to it; the old limit stays.
    #[error("memory cgroup {group}: {what} {bytes} bytes is below its usage ({usage} bytes) and reclaim could not get there; the old limit stays")]
    LimitBelowUsage {
        /// The group's id.
        group: u32,
        /// Which limit (`memory.max`, `memory.swap.max`).
        what: &'static str,
        /// The limit asked for, bytes.
        bytes: u64,
        /// The usage that stayed above it, bytes.
        usage: u64,
    },
    /// A memory cgroup value that is not usable.
    #[error("memory cgroup {group}: {what} {bytes} bytes: {reason}")]
    BadGroupValue {
        /// The group's id.
        group: u32,
        /// Which value.
        what: &'static str,
        /// The value given.
        bytes: u64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// Too many memory cgroups alive in one Mm.
    #[error("too many memory cgroups alive in this Mm (at most {max}); drop some first")]
    TooManyGroups {
        /// The most.
        max: u32,
    },
}

/// The `Error` of a refused `free_pages(pfn, order)`.
pub(crate) fn free_err(e: FreeError, pfn: Pfn, order: u32) -> Error {
    let pfn = pfn.get();
    match e {
        FreeError::InvalidOrder => Error::InvalidOrder { order },
        FreeError::OutOfRange => Error::OutOfRange { pfn },
        FreeError::Misaligned => Error::Misaligned { pfn, order },
        FreeError::NotAllocated => Error::NotAllocated { pfn },
        FreeError::WrongOrder { allocated } => Error::WrongOrder {
            pfn,
            allocated,
            given: order,
        },
        FreeError::Owned => Error::OwnedBySpace { pfn },
    }
}

/// Why a swap call was refused (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SwapError {
    #[error("swap size {bytes} bytes: {reason}")]
    BadSize { bytes: u64, reason: String },
    #[error("swap priority {priority}: give 0..={SWAP_PRIO_MAX}, or none for an automatic one")]
    BadPriority { priority: i32 },
    #[error("swap file {path:?}: {reason}")]
    BadPath { path: PathBuf, reason: String },
    #[error("swap file {path:?} is already on as {id:?}")]
    DuplicateFile { path: PathBuf, id: SwapId },
    #[error("{MAX_SWAPFILES} swap devices are on already; turn one off first")]
    TooManyDevices,
    #[error("swap device could not be set up: {kind:?}: {msg}")]
    Setup { kind: io::ErrorKind, msg: String },
    #[error("no swap device {id:?} is on")]
    NoSuchDevice { id: SwapId },
    #[error("swap device {id:?} has {used_pages} slots in use; bring them back before swapoff")]
    Busy { id: SwapId, used_pages: u64 },
    #[error("swap entry {entry:?} names no device that is on")]
    BadEntry { entry: SwapEntry },
    #[error(transparent)]
    Map(#[from] MapError),
    #[error(transparent)]
    Io(#[from] SwapIoError),
    #[error(transparent)]
    CacheExists(#[from] CacheExists),
}

pub(crate) fn setup_err(e: io::Error) -> SwapError {
    SwapError::Setup {
        kind: e.kind(),
        msg: e.to_string(),
    }
}
