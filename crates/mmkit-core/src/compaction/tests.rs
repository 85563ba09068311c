//! Unit tests of `compaction/mod.rs`: the retry ladder of `should_compact_retry`.

use super::*;

fn ladder(order: u32, results: &[CompactResult]) -> Vec<Option<CompactPriority>> {
    let (mut prio, mut retries) = (CompactPriority::INIT, 0);
    results
        .iter()
        .map(|&r| should_compact_retry(order, r, &mut prio, &mut retries).then_some(prio))
        .collect()
}

#[test]
fn costly_orders_stop_at_sync_light() {
    use CompactPriority::*;
    use CompactResult::*;
    for r in [Complete, PartialSkipped, Deferred] {
        assert_eq!(ladder(9, &[r, r]), [Some(SyncLight), None], "{r:?}");
    }
    assert_eq!(ladder(9, &[Skipped]), [None]);
}

#[test]
fn small_orders_go_on_to_sync_full() {
    use CompactPriority::*;
    use CompactResult::*;
    assert_eq!(
        ladder(3, &[PartialSkipped, Complete, Complete]),
        [Some(SyncLight), Some(SyncFull), None]
    );
    assert_eq!(
        ladder(1, &[Deferred, Deferred]),
        [Some(SyncLight), Some(SyncFull)]
    );
    assert_eq!(ladder(2, &[Skipped]), [None]);
}

#[test]
fn successes_whose_block_was_taken_are_retried_boundedly() {
    use CompactPriority::*;
    use CompactResult::*;
    // Above the costly order: 4 retries at a priority, then a higher one.
    let mut v = ladder(9, &[Success; 6]);
    assert_eq!(v.drain(..4).collect::<Vec<_>>(), [Some(Async); 4]);
    assert_eq!(v, [Some(SyncLight), Some(SyncLight)]);
    let v = ladder(3, &[Success; 17]);
    assert!(v[..16].iter().all(|p| *p == Some(Async)), "{v:?}");
    assert_eq!(v[16], Some(SyncLight));
    // Order 0 never compacts.
    assert_eq!(ladder(0, &[Success, Complete]), [None, None]);
    // Every ladder ends.
    for order in 1..=10 {
        for r in [Success, Complete, PartialSkipped, Deferred, Skipped] {
            let (mut prio, mut n) = (CompactPriority::INIT, 0);
            let mut steps = 0;
            while should_compact_retry(order, r, &mut prio, &mut n) {
                steps += 1;
                assert!(steps < 64, "order {order} {r:?} never ends");
            }
        }
    }
}
