//! Which pages reclaim keeps: two traces over one space, 64 MiB of memory, 4x
//! that mapped, a RAM swap device, under each LRU policy.
//! - zipf: Zipf(0.9) over the mapped pages (ranks scattered), 80% reads;
//!   swap-device reads (pswpin) per access after a warm-up.
//! - scan: a hot quarter of memory touched twice per round, then a one-pass
//!   write scan of 1.25x memory never reused; device reads during the hot
//!   touches per hot page per round (median of the rounds after 2 warm-up).
//!
//! - shift: the lab's hot-1/hot-2/cold case (hot sets of 3/4 memory, 4x
//!   memory cold, written once; then uniform accesses to hot-1, then as many
//!   to hot-2), counters per phase (`WIN=1`: per half-memory window).
//!
//! The scan case as the lab runs it (`mmlab run reclaim`), by environment:
//! `LAB=1` builds as the lab does (the `mmkit` variant, prefaulted),
//! `FILL=1` writes the hot set first, `SHUF=1` touches it in a fresh random
//! order per pass with 20% writes, `DISCARD=1` scans a mapping of its own
//! that is unmapped and mapped again after each round (the lab's segment
//! drop; the other knobs change nothing measurable).
//!
//! `cargo run --release -p mmkit --example wset_probe [zipf|scan|shift] [scale]`
//! (scale divides the access counts, default 1).

use mmkit::{LruPolicy, MapFlags, Mm, SwapDevice, VmEvent, PAGE_SIZE};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn build(policy: LruPolicy) -> Mm {
    let mm = Mm::builder()
        .memory(64 * MIB)
        .lru_policy(policy)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(320 << 20)).unwrap();
    mm
}

fn ev(mm: &Mm) -> [u64; 9] {
    let e = mm.vm_events();
    [
        e.get(VmEvent::PswpIn),
        e.get(VmEvent::PgScanKswapd) + e.get(VmEvent::PgScanDirect),
        e.get(VmEvent::PgStealKswapd) + e.get(VmEvent::PgStealDirect),
        e.get(VmEvent::PgActivate),
        e.get(VmEvent::PgDeactivate),
        e.get(VmEvent::WorkingsetRefaultAnon),
        e.get(VmEvent::WorkingsetActivateAnon),
        e.get(VmEvent::WorkingsetRestoreAnon),
        e.get(VmEvent::PgStealKswapd),
    ]
}

fn report(name: &str, policy: LruPolicy, metric: f64, a: [u64; 9], b: [u64; 9]) {
    let d: Vec<u64> = a.iter().zip(b).map(|(x, y)| y - x).collect();
    println!(
        "{name:5} {policy:?}: {metric:.4}  pgscan {} pgsteal {} (kswapd {}) pgactivate {} \
         pgdeactivate {} refault {} activate {} restore {}",
        d[1], d[2], d[8], d[3], d[4], d[5], d[6], d[7]
    );
}

fn zipf(policy: LruPolicy, scale: u64) {
    let mm = build(policy);
    let s = mm.new_space().unwrap();
    let n: u64 = 4 * 64 * MIB as u64 / PAGE;
    let a = s.mmap((n * PAGE) as usize, MapFlags::empty()).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Ranks scattered over the pages.
    let mut perm: Vec<u64> = (0..n).collect();
    for i in (1..n as usize).rev() {
        perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut cdf = Vec::with_capacity(n as usize);
    let mut sum = 0.0;
    for r in 1..=n {
        sum += 1.0 / (r as f64).powf(0.9);
        cdf.push(sum);
    }
    let access = |rng: &mut Rng| {
        let u = rng.unit() * sum;
        let r = cdf.partition_point(|&c| c < u).min(n as usize - 1);
        let addr = a + perm[r] * PAGE;
        if rng.next() % 10 < 8 {
            s.touch(addr, false).unwrap();
        } else {
            s.write(addr, &[1]).unwrap();
        }
    };
    for _ in 0..1_000_000 / scale {
        access(&mut rng);
    }
    let before = ev(&mm);
    let count = 2_000_000 / scale;
    for _ in 0..count {
        access(&mut rng);
    }
    let after = ev(&mm);
    report(
        "zipf",
        policy,
        (after[0] - before[0]) as f64 / count as f64,
        before,
        after,
    );
}

fn env(k: &str) -> bool {
    std::env::var(k).is_ok()
}
fn scan(policy: LruPolicy, rounds: usize) {
    let mm = if env("LAB") {
        let v = if policy == LruPolicy::Classic {
            mmkit::Variant::MmkitLruClassic
        } else {
            mmkit::Variant::Mmkit
        };
        let mm = Mm::builder()
            .memory(64 * MIB)
            .variant(v)
            .prefault(true)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(320 << 20).populated()).unwrap();
        mm
    } else {
        build(policy)
    };
    let s = mm.new_space().unwrap();
    let n: u64 = 4 * 64 * MIB as u64 / PAGE;
    let hot = n / 16; // a quarter of memory
    let scan = n * 5 / 16; // 1.25x memory
    let a = s.mmap((n * PAGE) as usize, MapFlags::empty()).unwrap();
    let mut b = s.mmap((scan * PAGE) as usize, MapFlags::empty()).unwrap();
    let mut per_round = Vec::new();
    let mut cursor = hot;
    let first = ev(&mm);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    if env("FILL") {
        for i in 0..hot {
            s.write(a + i * PAGE, &[3]).unwrap();
        }
    }
    for _ in 0..rounds {
        let before = ev(&mm)[0];
        for _ in 0..2 {
            let mut order: Vec<u64> = (0..hot).collect();
            if env("SHUF") {
                for i in (1..hot as usize).rev() {
                    order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
            }
            for &i in &order {
                if env("SHUF") && rng.next() % 10 < 2 {
                    s.write(a + i * PAGE, &[1]).unwrap();
                } else {
                    s.touch(a + i * PAGE, false).unwrap();
                }
            }
        }
        per_round.push((ev(&mm)[0] - before) as f64 / hot as f64);
        if env("DISCARD") {
            for i in 0..scan {
                s.write(b + i * PAGE, &[2]).unwrap();
            }
            s.munmap(b, (scan * PAGE) as usize).unwrap();
            b = s.mmap((scan * PAGE) as usize, MapFlags::empty()).unwrap();
        } else {
            for _ in 0..scan {
                s.write(a + cursor * PAGE, &[2]).unwrap();
                cursor += 1;
                if cursor == n {
                    cursor = hot;
                }
            }
        }
    }
    let mut tail: Vec<f64> = per_round[2..].to_vec();
    tail.sort_by(f64::total_cmp);
    let median = tail[tail.len() / 2];
    println!("scan  {policy:?}: per round {per_round:.3?}");
    report("scan", policy, median, first, ev(&mm));
}

fn shift(policy: LruPolicy) {
    let v = if policy == LruPolicy::Classic {
        mmkit::Variant::MmkitLruClassic
    } else {
        mmkit::Variant::Mmkit
    };
    let mm = Mm::builder()
        .memory(64 * MIB)
        .variant(v)
        .prefault(true)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(400 << 20).populated()).unwrap();
    let s = mm.new_space().unwrap();
    let m: u64 = 64 * MIB as u64 / PAGE;
    let hot = m * 3 / 4;
    let total = 2 * hot + 4 * m;
    let a = s.mmap((total * PAGE) as usize, MapFlags::empty()).unwrap();
    for i in 0..total {
        s.write(a + i * PAGE, &[1]).unwrap();
    }
    let mut rng = Rng(0x7777_1234_5678_9abc);
    for phase in 0..2u64 {
        let base = phase * hot;
        let before = ev(&mm);
        let mut win = ev(&mm);
        for k in 0..16 * hot {
            let p = base + rng.next() % hot;
            if rng.next() % 100 < 20 {
                s.write(a + p * PAGE, &[2]).unwrap();
            } else {
                s.touch(a + p * PAGE, false).unwrap();
            }
            if (k + 1) % (m / 2) == 0 && std::env::var("WIN").is_ok() {
                let e = ev(&mm);
                let d: Vec<u64> = e.iter().zip(win).map(|(x, y)| x - y).collect();
                println!(
                    "  win {k}: in {} scan {} steal {} act {} deact {} refault {} wsact {}",
                    d[0], d[1], d[2], d[3], d[4], d[5], d[6]
                );
                win = e;
            }
        }
        report("shift", policy, 0.0, before, ev(&mm));
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("shift") {
        for policy in [LruPolicy::Protected, LruPolicy::Classic] {
            shift(policy);
        }
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("both");
    let scale: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    for policy in [LruPolicy::Protected, LruPolicy::Classic] {
        if which != "scan" {
            zipf(policy, scale);
        }
        if which != "zipf" {
            scan(policy, 8);
        }
    }
}
