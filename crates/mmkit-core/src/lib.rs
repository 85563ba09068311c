//! mmkit-core: the `no_std` heart of mmkit — page descriptors, the buddy allocator
//! with zones, migratetypes, pageblocks and watermarks, per-CPU page lists,
//! compaction's free-page side, the statistics counters, and the page-clearing
//! kernels.
//!
//! Nothing here starts threads, opens files or calls libc. The environment (current
//! CPU, a clock, the zone lock type) comes in through [`Platform`]; memory comes in as
//! a number of frames, whose contents the core never touches except to clear them.

#![no_std]
#![warn(missing_docs)]

extern crate alloc;

pub mod clear;
pub mod compaction;
pub mod config;
pub mod gfp;
pub mod lru;
pub mod lru_policy;
pub mod node;
pub mod page;
mod page_alloc;
pub mod page_counter;
pub mod pcp;
pub mod pcp_cache;
pub mod platform;
pub mod stat;
pub mod zone;

pub use crate::page_alloc::{
    AllocError, Claim, FreeError, NoHooks, NodeReq, NumaStat, NumaStats, PageAlloc, SlowPathHooks,
    ZoneInfo,
};
pub use compaction::{CompactControl, CompactMode, CompactPriority, CompactResult, CompactStats};
pub use config::{Config, MergePolicy, PcpHighPolicy, PcpPolicy, RefillPolicy};
pub use gfp::{AllocContext, Gfp, MigrateType, MIGRATE_PCPTYPES, MIGRATE_TYPES};
pub use lru_policy::LruPolicy;
pub use node::{
    find_next_best_node, DistanceError, Distances, NodeMask, NodeMaskIter, NodeStates, Zonelists,
    LOCAL_DISTANCE, MAX_NUMNODES, REMOTE_DISTANCE, UNREACHABLE_DISTANCE,
};
pub use page::{
    Page, PageState, Pfn, MAX_ORDER, NR_ORDERS, PAGEBLOCK_NR_PAGES, PAGEBLOCK_ORDER, PAGE_SHIFT,
    PAGE_SIZE, PG_OWNED,
};
pub use pcp::PcpLock;
pub use platform::Platform;
pub use stat::{LockStats, VmEvent, VmEvents, NR_VM_EVENTS};
