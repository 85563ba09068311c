//! The swap device of each mmkit variant of pmbench: what it is (RAM, a file
//! under `--swap file:PATH`, an nbdkit memory server) is fixed when the variant
//! is built, but the device is on only for the variant's points.
//!
//! Why per point: all the variants of a workload are built before its first
//! point and live until its last, and a RAM device sized for the working sets
//! (`swap_bytes`, four arenas and a sixteenth) is backed when it is switched
//! on. Kept on for the whole workload, six such devices would need about
//! 16 GiB at the full sizes, and the run's planner would scale pmbench down to
//! the quick sizes, where the kernel peers do not run. On for a point only, one
//! device is backed at a time: the workload's peak is the arenas plus one
//! device (or the kernel peer's cgroup and its tmpfs swap file).
//!
//! Invariant: outside `with_swap`, an mmkit variant has no device on. Its
//! spaces are all gone when the point ends, so `swapoff` has no page to bring
//! back; a device that still holds pages is an error of the point, reported.

use super::{arena, nbd, swap_bytes};
use crate::peers::Peer;
use crate::runner::Config;
use mmkit::{ClearStrategy, Mm, SwapDevice, Variant};
use std::path::{Path, PathBuf};

/// What an mmkit variant swaps to, kept by its peer.
pub struct SwapSpec {
    bytes: u64,
    file: Option<PathBuf>,
    nbd: Option<nbd::Nbdkit>,
}

impl SwapSpec {
    fn device(&self) -> SwapDevice {
        match (&self.file, &self.nbd) {
            (Some(f), _) => SwapDevice::file(f.clone(), self.bytes),
            (None, Some(server)) => SwapDevice::nbd(server.uri(), self.bytes),
            // Backed now, as the kernel peer's tmpfs file is (fallocate): no
            // first-write host fault inside a measured interval.
            (None, None) => SwapDevice::ram(self.bytes).populated(),
        }
    }
}

/// The swap file of mmkit variant `variant` under `--swap file:PATH`: PATH
/// itself would be shared by the variants, which are all alive at once.
pub fn swap_file_for(path: &Path, variant: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{variant}"));
    s.into()
}

/// mmkit variant `name` (preset `v`) on a prefaulted arena; its swap device is
/// RAM, or its own file under `--swap file:PATH` (removed when the variant is
/// dropped), switched on by `with_swap`.
pub fn build_mmkit(name: &str, v: Variant, config: &Config) -> anyhow::Result<Peer> {
    let a = arena(config.timing.quick);
    let mut peer = Peer::create_mmkit(name, v, a, ClearStrategy::Auto)?;
    let file = config.swap_file.as_ref().map(|p| swap_file_for(p, name));
    if let Some(f) = &file {
        peer.remove_on_drop(f.clone());
    }
    let spec = SwapSpec {
        bytes: swap_bytes(a) as u64,
        file,
        nbd: None,
    };
    peer.keep_alive(Box::new(spec));
    Ok(peer)
}

/// `mmkit-nbd`: `Variant::Mmkit` swapping to an nbdkit memory server of its
/// own (the swap size and the device's 4 KiB header page), kept alive by the
/// peer and stopped after its `Mm` is gone.
pub fn build_mmkit_nbd(name: &str, config: &Config) -> anyhow::Result<Peer> {
    let a = arena(config.timing.quick);
    let mut peer = Peer::create_mmkit(name, Variant::Mmkit, a, ClearStrategy::Auto)?;
    let bytes = swap_bytes(a) as u64;
    let server = nbd::Nbdkit::start(bytes + 4096)
        .map_err(|e| anyhow::anyhow!("pmbench {name}: nbdkit: {e}"))?;
    peer.keep_alive(Box::new(SwapSpec {
        bytes,
        file: None,
        nbd: Some(server),
    }));
    Ok(peer)
}

/// Runs `point` on `peer`'s mm with its swap device on, and switches it off
/// afterwards. A custom variant (`--set`) has no spec: it gets a RAM device
/// sized as the named variants'.
pub fn with_swap<T>(
    peer: &Peer,
    mm: &Mm,
    arena: usize,
    point: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    let dev = match peer.kept::<SwapSpec>() {
        Some(spec) => spec.device(),
        None => SwapDevice::ram(swap_bytes(arena) as u64).populated(),
    };
    let id = mm.swapon(dev).map_err(|e| format!("swapon: {e}"))?;
    let r = point();
    let off = mm
        .swapoff(id)
        .map_err(|e| format!("swapoff after the point: {e}"));
    match (r, off) {
        (Ok(v), Ok(())) => Ok(v),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}
