//! Tests of `reclaim`: trace files good and bad, the synthetic cases' shapes,
//! and small replays on mmkit and the models.

use super::lru_exact::LruExact;
use super::replay::replay;
use super::trace::*;
use super::*;
use std::io::Write;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mmlab-reclaim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write_trace(path: &Path, recs: &[(u64, bool)]) -> Header {
    let mut w = TraceWriter::create(path).unwrap();
    for &(p, wr) in recs {
        w.push(p, wr).unwrap();
    }
    w.finish().unwrap()
}

use std::path::Path;

fn read_all(path: &Path) -> Result<Vec<Event>, TraceError> {
    let mut src = FileSource::open(path, 1)?;
    let mut all = Vec::new();
    let mut buf = Vec::new();
    loop {
        src.fill(&mut buf, 3)?;
        if buf.is_empty() {
            return Ok(all);
        }
        all.extend_from_slice(&buf);
    }
}

#[test]
fn a_good_file_reads_back_in_small_batches() {
    let p = tmp("good.mmtrace");
    let recs = [(0, true), (1, false), (0, false), (2, true), (1, true)];
    let h = write_trace(&p, &recs);
    assert_eq!(
        h,
        Header {
            footprint: 3,
            records: 5
        }
    );
    assert_eq!(file_header(&p).unwrap(), h);
    let ev = read_all(&p).unwrap();
    assert_eq!(ev.first(), Some(&Event::Measure(true)));
    assert_eq!(ev.last(), Some(&Event::Measure(false)));
    let touches: Vec<(u64, bool)> = ev
        .iter()
        .filter_map(|e| match *e {
            Event::Touch { page, write } => Some((page, write)),
            _ => None,
        })
        .collect();
    assert_eq!(touches, recs);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), HEADER + 5 * 4);
}

fn err_of(bytes: &[u8]) -> String {
    let p = tmp("bad.mmtrace");
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    let e = match FileSource::open(&p, 1) {
        Err(e) => e,
        Ok(_) => read_all(&p).unwrap_err(),
    };
    e.0
}

#[test]
fn bad_files_name_the_byte_offset() {
    let p = tmp("base.mmtrace");
    write_trace(&p, &[(0, true), (1, false), (2, true)]);
    let good = std::fs::read(&p).unwrap();
    // Truncated inside the header.
    let e = err_of(&good[..20]);
    assert!(e.contains("truncated header at byte offset 20"), "{e}");
    // Truncated in the middle of the third record.
    let e = err_of(&good[..good.len() - 2]);
    assert!(e.contains("truncated at byte offset 40"), "{e}");
    assert!(e.contains("holds 2 and a partial one"), "{e}");
    // A whole record missing.
    let e = err_of(&good[..good.len() - 4]);
    assert!(e.contains("truncated at byte offset 40"), "{e}");
    // Bad magic, version, flags, footprint.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(err_of(&b).contains("bad magic at byte offset 0"));
    let mut b = good.clone();
    b[8] = 9;
    assert!(err_of(&b).contains("unsupported version 9 at byte offset 8"));
    let mut b = good.clone();
    b[12] = 1;
    assert!(err_of(&b).contains("flags 0x1 at byte offset 12"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&0u64.to_le_bytes());
    assert!(err_of(&b).contains("bad footprint 0 at byte offset 16"));
    // A page at or above the footprint, in the second record.
    let mut b = good.clone();
    b[36..40].copy_from_slice(&(7u32 << 1).to_le_bytes());
    let e = err_of(&b);
    assert!(e.contains("page 7 at byte offset 36"), "{e}");
    // Trailing garbage.
    let mut b = good.clone();
    b.push(0);
    assert!(err_of(&b).contains("trailing bytes at byte offset 44"));
    // Not there at all.
    let e = FileSource::open(&tmp("missing.mmtrace"), 1).err().unwrap();
    assert!(e.0.contains("missing.mmtrace"), "{e}");
}

/// Counts of each synthetic case's events, from its plan.
fn census(case: Case, m: u64) -> (Shape, u64, u64, u64) {
    let mut s = Synthetic::new(case, m);
    let shape = s.shape().clone();
    let (mut touches, mut measured, mut discards) = (0, 0, 0);
    let mut on = false;
    let mut buf = Vec::new();
    loop {
        s.fill(&mut buf, 1000).unwrap();
        if buf.is_empty() {
            break;
        }
        for e in &buf {
            match *e {
                Event::Touch { page, .. } => {
                    assert!(page < shape.pages, "{case:?}: page {page}");
                    touches += 1;
                    measured += u64::from(on);
                }
                Event::Measure(b) => on = b,
                Event::Discard(n) => {
                    assert!(n < shape.segments());
                    discards += 1
                }
                Event::Sample => {}
            }
        }
    }
    (shape, touches, measured, discards)
}

#[test]
fn synthetic_cases_have_their_shape() {
    let m = 1024;
    let (s, t, meas, _) = census(Case::Zipf, m);
    assert_eq!(s.pages, 4 * m);
    assert_eq!(t, 4 * m + 120_000);
    assert_eq!(meas, 60_000);
    // scan: 4 rounds of 2 x 256 hot touches and 1280 scan writes; 2 measured.
    let (s, t, meas, d) = census(Case::Scan, m);
    assert_eq!((s.pages, s.segment_pages), (2560, 1280));
    assert_eq!(t, 256 + 4 * (512 + 1280));
    assert_eq!(meas, 2 * 512);
    assert_eq!(d, 4);
    let (s, _, meas, _) = census(Case::Shift, m);
    assert_eq!(s.pages, 2 * 768 + 4 * m);
    assert_eq!(meas, 2 * shift_phase_accesses(m));
    let (s, _, meas, _) = census(Case::Loop, m);
    assert_eq!(s.pages, m + m / 10);
    assert_eq!(meas, 2 * s.pages);
    // Deterministic: the child regenerates the same stream.
    let mut a = Synthetic::new(Case::Zipf, m);
    let mut b = Synthetic::new(Case::Zipf, m);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    a.fill(&mut x, 5000).unwrap();
    b.fill(&mut y, 5000).unwrap();
    assert_eq!(x, y);
    let spec = Spec::Synthetic {
        case: Case::Shift,
        memory_pages: m,
    };
    assert_eq!(Spec::from_args(&spec.to_args()), Some(spec));
}

#[test]
fn exact_lru_on_the_scan_case_faults_every_hot_page_each_round() {
    let m = 1024;
    let mut src = Synthetic::new(Case::Scan, m);
    let mut l = LruExact::new(src.shape().pages, src.shape().segment_pages, m);
    let o = replay(&mut src, &mut l).unwrap();
    // 2 measured rounds x 256 hot pages, each read back once per round.
    assert_eq!(o.counts.reads, 512);
    assert_eq!(o.accesses, 1024);
    assert_eq!(o.corrupt, 0);
}

/// Every case replays on a small mmkit with swap: content intact, device
/// reads counted, and nothing left behind.
#[test]
fn cases_replay_on_mmkit_with_swap() {
    let m = 1024u64;
    let mm = Mm::builder()
        .memory((m * 4096) as usize)
        .prefault(true)
        .build()
        .unwrap();
    let free0 = mm.nr_free_pages();
    mm.swapon(SwapDevice::ram(16 << 20)).unwrap();
    for case in [Case::Zipf, Case::Scan, Case::Loop] {
        let spec = Spec::Synthetic {
            case,
            memory_pages: m,
        };
        let o = run_mmkit(&mm, &spec).unwrap();
        assert_eq!(o.corrupt, 0, "{case:?}");
        assert_eq!(o.failures, 0, "{case:?}");
        assert!(o.accesses > 0);
        if case == Case::Scan {
            // The hot set stays (nothing of it read back): the scan went out.
            assert!(
                o.span.pgsteal_kswapd + o.span.pgsteal_direct > 0,
                "{case:?}: no reclaim"
            );
        } else {
            assert!(o.counts.reads > 0, "{case:?}: nothing read back from swap");
        }
        assert!(
            o.resident > 0 && o.resident <= m,
            "{case:?}: {}",
            o.resident
        );
        let f = figures(case.name(), &spec, &o, false);
        assert!(f.iter().all(|x| x.case.as_deref() == Some(case.name())));
    }
    mm.wait_reclaim_idle();
    mm.drain_all_pages();
    mm.check().unwrap();
    assert_eq!(mm.nr_free_pages(), free0);
}
