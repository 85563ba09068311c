//! The mmkit variants that several workloads share, and how each is built:
//!
//! - the fault presets (`page_fault1`, `anon_w_seq`, `parallel_free`): `mmkit`
//!   with its default clearing, `mmkit-eager` and `mmkit-nopcp` (the "before"
//!   policy presets, with page-at-a-time clearing); a workload's other variants
//!   are `Peer::Native`, measured by the workload itself;
//! - the merge presets (`highalloc`, `order0_thp_mix`): `mmkit`, `mmkit-eager`,
//!   `mmkit-nomerge`, which differ in the merging policy and its per-CPU list
//!   policies only (same compaction, clearing `Auto`).

use crate::peers::{Peer, VariantInfo};
use anyhow::{bail, Result};
use mmkit::{ClearStrategy, Variant};

/// The policy preset and clearing strategy of a fault preset.
pub fn fault_preset(name: &str) -> Option<(Variant, ClearStrategy)> {
    match name {
        "mmkit" => Some((Variant::Mmkit, ClearStrategy::Auto)),
        "mmkit-eager" => Some((Variant::MmkitEager, ClearStrategy::PageAtATime)),
        "mmkit-nopcp" => Some((Variant::MmkitNoPcp, ClearStrategy::PageAtATime)),
        _ => None,
    }
}

/// Builds variant `variant` of a workload whose variants are `own`: a fault
/// preset on an arena of `arena` bytes, any other of `own` as `Native`.
pub fn build_fault_preset(
    own: &'static [VariantInfo],
    variant: &str,
    arena: usize,
) -> Result<Peer> {
    let Some(info) = own.iter().find(|v| v.name == variant) else {
        bail!("unknown variant {variant:?} for this workload");
    };
    match fault_preset(variant) {
        Some((v, clear)) => Peer::create_mmkit(variant, v, arena, clear),
        None => Ok(Peer::Native(info.name)),
    }
}

/// The variants of `highalloc` and `order0_thp_mix`.
pub const MERGE_VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit defaults: lazy order-0 merging with merge on demand, cluster \
                      refill, auto PCP high; direct compaction and kcompactd",
    },
    VariantInfo {
        name: "mmkit-eager",
        description: "eager merging on every free, page-by-page refill, fixed PCP high; the \
                      same compaction",
    },
    VariantInfo {
        name: "mmkit-nomerge",
        description: "lazy order-0 merging without merge on demand (Linux's skip-merge patch \
                      alone); the same compaction, without its merge step",
    },
];

/// Builds a merge preset: its policy preset, clearing `Auto`, a prefaulted
/// arena of `arena` bytes.
pub fn build_merge_preset(variant: &str, arena: usize) -> Result<Peer> {
    let v = match variant {
        "mmkit" => Variant::Mmkit,
        "mmkit-eager" => Variant::MmkitEager,
        "mmkit-nomerge" => Variant::MmkitNoMerge,
        _ => bail!("unknown variant {variant:?} for this workload"),
    };
    Peer::create_mmkit(variant, v, arena, ClearStrategy::Auto)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_build_their_variants_and_refuse_others() {
        assert!(fault_preset("mmkit-nopcp").is_some());
        assert!(fault_preset("kernel").is_none());
        let own = &[VariantInfo {
            name: "kernel",
            description: "",
        }];
        assert!(matches!(
            build_fault_preset(own, "kernel", 16 << 20),
            Ok(Peer::Native("kernel"))
        ));
        assert!(build_fault_preset(own, "mmkit", 16 << 20).is_err());
        assert!(build_merge_preset("kernel", 16 << 20).is_err());
        for v in MERGE_VARIANTS {
            assert!(build_merge_preset(v.name, 16 << 20).unwrap().mm().is_some());
        }
    }
}
