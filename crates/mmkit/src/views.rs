//! Text views shaped like `/proc/buddyinfo`, `/proc/pagetypeinfo`, `/proc/vmstat`,
//! `/proc/meminfo` and `/proc/swaps`, and `Mm`'s debug view.

use std::fmt::Write;

use crate::{MigrateType, Mm, SwapInfo, SwapKind};
use mmkit_core::{MIGRATE_TYPES, NR_ORDERS, PAGEBLOCK_ORDER};

impl Mm {
    /// Every memory cgroup as `/sys/fs/cgroup` shows it: the root's
    /// `memory.current` and `memory.swap.current`, then each group, parents
    /// first, under `# /g<id>/g<id>...` with its files ([`crate::MemCgroup::text`]).
    pub fn memcg_text(&self) -> String {
        let mut s = String::new();
        let swap: u64 = self
            .memcg()
            .all()
            .iter()
            .filter(|g| g.parent().is_none())
            .map(|g| g.swap.usage())
            .sum();
        let _ = writeln!(
            s,
            "# /\n== memory.current ==\n{}\n== memory.swap.current ==\n{}",
            self.root_current(),
            swap * crate::PAGE_SIZE as u64
        );
        let mut groups: Vec<crate::MemCgroup> = self
            .memcg()
            .all()
            .into_iter()
            .map(|inner| crate::MemCgroup { inner })
            .collect();
        groups.sort_by_key(|g| g.path());
        for g in groups {
            let _ = write!(s, "# {}\n{}", g.path(), g.text());
        }
        s
    }

    /// Memory and swap, as `/proc/meminfo` (kB): MemTotal, MemFree,
    /// Active(anon), Inactive(anon), SwapTotal, SwapFree, SwapCached.
    pub fn meminfo(&self) -> String {
        let kb = |pages: u64| pages * (crate::PAGE_SIZE as u64 / 1024);
        let (mut active, mut inactive) = (0, 0);
        for nid in 0..self.nr_nodes() {
            let (a, i) = self.lru().nr_pages(self, nid);
            active += a;
            inactive += i;
        }
        let (swap_total, swap_free) = self.swap().nr_swap_pages();
        let cached: u64 = self.swap_info().iter().map(|i| i.cached_pages).sum();
        let mut s = String::new();
        for (name, pages) in [
            ("MemTotal", self.nr_managed_pages()),
            ("MemFree", self.nr_free_pages()),
            ("Active(anon)", active),
            ("Inactive(anon)", inactive),
            ("SwapTotal", swap_total),
            ("SwapFree", swap_free),
            ("SwapCached", cached),
        ] {
            let _ = writeln!(s, "{:<16}{:>10} kB", format!("{name}:"), kb(pages));
        }
        s
    }

    /// Free blocks per order, per zone, as `/proc/buddyinfo`.
    pub fn buddyinfo(&self) -> String {
        let mut s = String::new();
        for z in self.zone_info() {
            let _ = write!(s, "Node {}, zone {:>8}", z.node, z.name);
            for o in 0..NR_ORDERS {
                let _ = write!(s, " {:>6}", z.free_blocks[o].iter().sum::<u64>());
            }
            s.push('\n');
        }
        s
    }

    /// Free blocks per order and migratetype, and pageblocks per migratetype, as
    /// `/proc/pagetypeinfo`.
    pub fn pagetypeinfo(&self) -> String {
        let zones = self.zone_info();
        let mut s = String::new();
        let _ = writeln!(s, "Page block order: {PAGEBLOCK_ORDER}");
        let _ = writeln!(s, "Pages per block:  {}\n", 1u32 << PAGEBLOCK_ORDER);
        let _ = write!(s, "{:<44}", "Free pages count per migrate type at order");
        for o in 0..NR_ORDERS {
            let _ = write!(s, " {o:>6}");
        }
        s.push('\n');
        for z in &zones {
            for mt in 0..MIGRATE_TYPES {
                let _ = write!(
                    s,
                    "Node {:>4}, zone {:>8}, type {:>12}",
                    z.node,
                    z.name,
                    MigrateType::from_index(mt).name()
                );
                for o in 0..NR_ORDERS {
                    let _ = write!(s, " {:>6}", z.free_blocks[o][mt]);
                }
                s.push('\n');
            }
        }
        let _ = write!(s, "\n{:<24}", "Number of blocks type");
        for mt in 0..MIGRATE_TYPES {
            let _ = write!(s, " {:>12}", MigrateType::from_index(mt).name());
        }
        s.push('\n');
        for z in &zones {
            let _ = write!(s, "Node {}, zone {:>8}   ", z.node, z.name);
            for mt in 0..MIGRATE_TYPES {
                let _ = write!(s, " {:>12}", z.pageblocks[mt]);
            }
            s.push('\n');
        }
        s
    }

    /// Counters as `/proc/vmstat` (`name value` lines), plus zone and lock state.
    pub fn vmstat(&self) -> String {
        let mut s = String::new();
        let zones = self.zone_info();
        let _ = writeln!(
            s,
            "nr_free_pages {}",
            zones.iter().map(|z| z.nr_free + z.nr_pcp).sum::<u64>()
        );
        let _ = writeln!(
            s,
            "nr_free_buddy {}",
            zones.iter().map(|z| z.nr_free).sum::<u64>()
        );
        let _ = writeln!(
            s,
            "nr_free_pcp {}",
            zones.iter().map(|z| z.nr_pcp).sum::<u64>()
        );
        let _ = writeln!(
            s,
            "nr_unmerged {}",
            zones.iter().map(|z| z.nr_unmerged).sum::<u64>()
        );
        let _ = writeln!(
            s,
            "nr_managed {}",
            zones.iter().map(|z| z.managed).sum::<u64>()
        );
        for (name, v) in self.vm_events().iter() {
            let _ = writeln!(s, "{name} {v}");
        }
        let cs = self.compaction_stats();
        for o in 1..NR_ORDERS {
            let (ok, fail, def) = (cs.success[o], cs.fail[o], cs.deferred[o]);
            if ok + fail + def > 0 {
                let _ = writeln!(s, "compact_success_order{o} {ok}");
                let _ = writeln!(s, "compact_fail_order{o} {fail}");
                let _ = writeln!(s, "compact_deferred_order{o} {def}");
            }
        }
        let _ = writeln!(s, "compact_defer_shift {}", cs.defer_shift);
        let _ = writeln!(s, "fragmentation_score {}", self.fragmentation_score());
        for z in &zones {
            let mut n = z.name.to_ascii_lowercase();
            if zones.len() > 1 {
                n = format!("node{}_{n}", z.node);
            }
            let _ = writeln!(s, "zone_{n}_wmark_min {}", z.wmark[0]);
            let _ = writeln!(s, "zone_{n}_wmark_low {}", z.wmark[1]);
            let _ = writeln!(s, "zone_{n}_wmark_high {}", z.wmark[2]);
            let _ = writeln!(s, "zone_{n}_lock_acquisitions {}", z.lock.acquisitions);
            let _ = writeln!(s, "zone_{n}_lock_contended {}", z.lock.contended);
            let _ = writeln!(s, "zone_{n}_lock_wait_ns {}", z.lock.wait_ns);
        }
        s
    }
}

/// `/proc/swaps` for the devices `info` (sizes in kB).
pub(crate) fn proc_swaps(info: &[SwapInfo]) -> String {
    let mut s = format!(
        "{:<40}{:<16}{:<16}{:<16}{}\n",
        "Filename", "Type", "Size", "Used", "Priority"
    );
    for i in info {
        let kind = match i.kind {
            SwapKind::Ram => "ram",
            SwapKind::File => "file",
            SwapKind::Backend => "backend",
            SwapKind::Nbd => "nbd",
        };
        s += &format!(
            "{:<40}{:<16}{:<16}{:<16}{}\n",
            i.filename,
            kind,
            i.size_pages * 4,
            i.used_pages * 4,
            i.priority
        );
    }
    s
}

impl std::fmt::Debug for Mm {
    /// The arena, the nodes, the free pages and how pages are cleared (the
    /// strategy and the plan `Auto` follows: what the calibration chose on this
    /// host, or the override).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mm")
            .field("memory_bytes", &self.inner.arena.len())
            .field("nr_nodes", &self.nr_nodes())
            .field("nr_free_pages", &self.nr_free_pages())
            .field("clear", &self.clear_strategy())
            .field("clear_plan", &format_args!("{}", self.clear_plan()))
            .field("fault_around", &self.fault_around())
            .finish_non_exhaustive()
    }
}
