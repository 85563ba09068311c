//! The traces `reclaim` replays: a stream of page-granular events over a dense
//! page range, from a synthetic generator (`zipf`, `scan`, `shift`, `loop`) or
//! from a trace file recorded from a real program (`mmlab trace record`).
//!
//! Every peer reads the same stream: the mmkit variants and `lru-exact` in the
//! lab process, the `kernel` peer's child process by regenerating it from the
//! same `Spec` (a synthetic case and its sizes, or the file's path). A stream
//! is read in batches (`Source::fill`), never held whole, so a trace larger
//! than memory streams.
//!
//! The file format (little-endian), version 1:
//! - header, 32 bytes: magic `MMTRACE\0`, `u32` version (1), `u32` flags (0),
//!   `u64` footprint (distinct pages; every page number is below it), `u64`
//!   number of records;
//! - records, 4 bytes each: bit 0 set for a write, bits 1..32 the page number.
//!   Pages are numbered densely in the order the program first touched them; a
//!   record is one run of consecutive references to one page.
//!
//! A file shorter than its header says, a bad magic or version, or a page
//! number at or above the footprint is an error naming the byte offset.

use super::super::XorShift;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// One event of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An access to `page` (a write if `write`).
    Touch { page: u64, write: bool },
    /// Counting on (true) or off: only accesses and device reads between an
    /// on and the next off are measured.
    Measure(bool),
    /// A point of the time series (cumulative measured accesses and reads).
    Sample,
    /// Segment `n` is dropped: unmapped and mapped again, its pages fresh.
    Discard(u64),
}

/// What a trace covers.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Distinct pages: every page number is below it.
    pub pages: u64,
    /// Pages per segment (the unit of `Discard`); `pages` for one segment.
    pub segment_pages: u64,
    /// The memory it is meant for, in pages.
    pub memory_pages: u64,
    /// Measured accesses per reported unit (scan: 2, two touches per hot page
    /// per round; otherwise 1, per access).
    pub accesses_per_unit: f64,
}

impl Shape {
    #[cfg(test)]
    pub fn segments(&self) -> u64 {
        self.pages.div_ceil(self.segment_pages.max(1))
    }
}

/// A trace error: what and where.
#[derive(Debug, PartialEq, Eq)]
pub struct TraceError(pub String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

/// A stream of events.
pub trait Source: Send {
    fn shape(&self) -> &Shape;
    /// Appends up to `max` events to `buf` (cleared first); an empty `buf`
    /// means the end.
    fn fill(&mut self, buf: &mut Vec<Event>, max: usize) -> Result<(), TraceError>;
}

/// Which trace, as both the lab and the kernel child can rebuild it.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// A synthetic case at `memory_pages`.
    Synthetic { case: Case, memory_pages: u64 },
    /// A recorded trace file, replayed in `memory_pages`.
    File { path: PathBuf, memory_pages: u64 },
}

impl Spec {
    pub fn open(&self) -> Result<Box<dyn Source>, TraceError> {
        match self {
            Spec::Synthetic { case, memory_pages } => {
                Ok(Box::new(Synthetic::new(*case, *memory_pages)))
            }
            Spec::File { path, memory_pages } => {
                Ok(Box::new(FileSource::open(path, *memory_pages)?))
            }
        }
    }

    /// As command-line words for the child: `synthetic CASE PAGES` or `file PAGES PATH`.
    pub fn to_args(&self) -> Vec<String> {
        match self {
            Spec::Synthetic { case, memory_pages } => vec![
                "synthetic".into(),
                case.name().into(),
                memory_pages.to_string(),
            ],
            Spec::File { path, memory_pages } => vec![
                "file".into(),
                memory_pages.to_string(),
                path.to_string_lossy().into_owned(),
            ],
        }
    }

    pub fn from_args(a: &[String]) -> Option<Spec> {
        match a {
            [k, c, p] if k == "synthetic" => Some(Spec::Synthetic {
                case: Case::from_name(c)?,
                memory_pages: p.parse().ok()?,
            }),
            [k, p, path] if k == "file" => Some(Spec::File {
                path: PathBuf::from(path),
                memory_pages: p.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// The synthetic cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Zipf,
    Scan,
    Shift,
    Loop,
}

impl Case {
    pub const ALL: [Case; 4] = [Case::Zipf, Case::Scan, Case::Shift, Case::Loop];

    pub fn name(self) -> &'static str {
        match self {
            Case::Zipf => "zipf",
            Case::Scan => "scan",
            Case::Shift => "shift",
            Case::Loop => "loop",
        }
    }

    pub fn from_name(s: &str) -> Option<Case> {
        Case::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Zipf's exponent of the `zipf` case.
pub const ZIPF_S: f64 = 0.9;
/// Writes in percent of the random accesses.
pub const WRITE_PCT: u64 = 20;
const SEED: u64 = 0x0072_6563_6c61_696d;

/// One piece of a synthetic trace.
#[derive(Clone, Debug)]
enum Step {
    /// Write every page of [from, to) once, in order.
    Fill { from: u64, to: u64 },
    /// `n` Zipf-distributed accesses over [0, pages) (ranks scattered).
    Zipf { n: u64 },
    /// `n` uniformly random accesses over [base, base + pages).
    Uniform { base: u64, pages: u64, n: u64 },
    /// `passes` passes over [base, base + pages), each in a fresh random order.
    Shuffled { base: u64, pages: u64, passes: u64 },
    /// `passes` passes over [base, base + pages) in order (writes if `write`,
    /// else 80% reads).
    Seq {
        base: u64,
        pages: u64,
        passes: u64,
        write: bool,
    },
    /// A marker, emitted once.
    Mark(Event),
    /// `Sample` every `every` accesses of the following steps (0: off).
    SampleEvery(u64),
}

/// The Zipf sampler: the CDF over ranks, and the page of each rank.
struct Zipf {
    cdf: Vec<f64>,
    page_of_rank: Vec<u64>,
}

impl Zipf {
    fn new(pages: u64, rng: &mut XorShift) -> Zipf {
        let mut cdf = Vec::with_capacity(pages as usize);
        let mut sum = 0.0;
        for r in 1..=pages {
            sum += 1.0 / (r as f64).powf(ZIPF_S);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        // Hot pages scattered: rank r lives at a random page.
        let mut page_of_rank: Vec<u64> = (0..pages).collect();
        shuffle(&mut page_of_rank, rng);
        Zipf { cdf, page_of_rank }
    }

    fn sample(&self, rng: &mut XorShift) -> u64 {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let r = self.cdf.partition_point(|&c| c < u);
        self.page_of_rank[r.min(self.cdf.len() - 1)]
    }
}

fn shuffle(v: &mut [u64], rng: &mut XorShift) {
    for i in (1..v.len()).rev() {
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
}

/// The sizes of a case at `memory_pages` (m): the trace's shape and its steps.
fn plan(case: Case, m: u64) -> (Shape, Vec<Step>) {
    let quick = m < 8192;
    let shape = |pages: u64, segment_pages: u64, per_unit: f64| Shape {
        pages,
        segment_pages,
        memory_pages: m,
        accesses_per_unit: per_unit,
    };
    match case {
        // One space 4x memory, filled once, then Zipf(0.9) accesses.
        Case::Zipf => {
            let pages = 4 * m;
            let (warm, n) = if quick {
                (60_000, 60_000)
            } else {
                (400_000, 1_000_000)
            };
            let steps = vec![
                Step::Fill { from: 0, to: pages },
                Step::Zipf { n: warm },
                Step::Mark(Event::Measure(true)),
                Step::Zipf { n },
                Step::Mark(Event::Measure(false)),
            ];
            (shape(pages, pages, 1.0), steps)
        }
        // A hot quarter touched twice per round (segment 0); between rounds
        // a write scan of 1.25x memory (segment 1), dropped after it.
        Case::Scan => {
            let hot = m / 4;
            let scan = m + m / 4;
            let (warm, rounds) = if quick { (2, 4) } else { (2, 12) };
            let mut steps = vec![Step::Fill { from: 0, to: hot }];
            for r in 0..rounds {
                steps.push(Step::Mark(Event::Measure(r >= warm)));
                steps.push(Step::Shuffled {
                    base: 0,
                    pages: hot,
                    passes: 2,
                });
                steps.push(Step::Mark(Event::Measure(false)));
                steps.push(Step::Seq {
                    base: scan,
                    pages: scan,
                    passes: 1,
                    write: true,
                });
                steps.push(Step::Mark(Event::Discard(1)));
            }
            (shape(2 * scan, scan, 2.0), steps)
        }
        // Joonsoo Kim's hot-1 / hot-2 / cold test, scaled: everything written
        // once (hot-1, hot-2, then 4x memory of cold), then random accesses to
        // hot-1, then as many to hot-2; each hot set is 3/4 of memory.
        Case::Shift => {
            let hot = m * 3 / 4;
            let cold = 4 * m;
            let per = if quick { 4 * hot } else { 16 * hot };
            let steps = vec![
                Step::Fill {
                    from: 0,
                    to: 2 * hot + cold,
                },
                Step::SampleEvery(m / 16),
                Step::Mark(Event::Measure(true)),
                Step::Uniform {
                    base: 0,
                    pages: hot,
                    n: per,
                },
                Step::Mark(Event::Sample),
                Step::Uniform {
                    base: hot,
                    pages: hot,
                    n: per,
                },
                Step::Mark(Event::Measure(false)),
            ];
            (shape(2 * hot + cold, 2 * hot + cold, 1.0), steps)
        }
        // A cyclic loop over 1.1x memory, 80% reads.
        Case::Loop => {
            let pages = m + m / 10;
            let (warm, n) = if quick { (1, 2) } else { (2, 5) };
            let steps = vec![
                Step::Fill { from: 0, to: pages },
                Step::Seq {
                    base: 0,
                    pages,
                    passes: warm,
                    write: false,
                },
                Step::Mark(Event::Measure(true)),
                Step::Seq {
                    base: 0,
                    pages,
                    passes: n,
                    write: false,
                },
                Step::Mark(Event::Measure(false)),
            ];
            (shape(pages, pages, 1.0), steps)
        }
    }
}

/// Measured accesses of each hot phase of `shift` at `memory_pages`: the hot
/// set moves after this many.
pub fn shift_phase_accesses(memory_pages: u64) -> u64 {
    let (_, steps) = plan(Case::Shift, memory_pages.max(64));
    steps
        .iter()
        .find_map(|s| match s {
            Step::Uniform { n, .. } => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

/// A synthetic trace, generated lazily.
pub struct Synthetic {
    shape: Shape,
    steps: Vec<Step>,
    step: usize,
    /// Progress inside the current step.
    pos: u64,
    order: Vec<u64>,
    zipf: Option<Zipf>,
    rng: XorShift,
    sample_every: u64,
    since_sample: u64,
}

impl Synthetic {
    pub fn new(case: Case, memory_pages: u64) -> Synthetic {
        let (shape, steps) = plan(case, memory_pages.max(64));
        let mut rng = XorShift::new(SEED);
        let zipf = (case == Case::Zipf).then(|| Zipf::new(shape.pages, &mut rng));
        Synthetic {
            shape,
            steps,
            step: 0,
            pos: 0,
            order: Vec::new(),
            zipf,
            rng,
            sample_every: 0,
            since_sample: 0,
        }
    }

    fn write_draw(&mut self) -> bool {
        (self.rng.next_u64() >> 7) % 100 < WRITE_PCT
    }

    /// The next event of the current step, or None when it is done.
    fn next_of_step(&mut self) -> Option<Event> {
        let step = self.steps[self.step].clone();
        let i = self.pos;
        let touch = match step {
            Step::Mark(e) => {
                if i > 0 {
                    return None;
                }
                self.pos = 1;
                return Some(e);
            }
            Step::SampleEvery(n) => {
                self.sample_every = n;
                self.since_sample = 0;
                return None;
            }
            Step::Fill { from, to } => (from + i < to).then(|| (from + i, true)),
            Step::Zipf { n } => (i < n).then(|| {
                let page = self
                    .zipf
                    .as_ref()
                    .expect("zipf table")
                    .sample(&mut self.rng);
                (page, self.write_draw())
            }),
            Step::Uniform { base, pages, n } => (i < n).then(|| {
                let r = self.rng.next_u64();
                let page = base + ((u128::from(r) * u128::from(pages)) >> 64) as u64;
                (page, self.write_draw())
            }),
            Step::Shuffled {
                base,
                pages,
                passes,
            } => (i < pages * passes).then(|| {
                if i.is_multiple_of(pages) {
                    self.order = (base..base + pages).collect();
                    let mut rng = XorShift::new(self.rng.next_u64());
                    shuffle(&mut self.order, &mut rng);
                }
                let page = self.order[(i % pages) as usize];
                (page, self.write_draw())
            }),
            Step::Seq {
                base,
                pages,
                passes,
                write,
            } => (i < pages * passes).then(|| (base + i % pages, write || self.write_draw())),
        }?;
        self.pos += 1;
        Some(Event::Touch {
            page: touch.0,
            write: touch.1,
        })
    }
}

impl Source for Synthetic {
    fn shape(&self) -> &Shape {
        &self.shape
    }

    fn fill(&mut self, buf: &mut Vec<Event>, max: usize) -> Result<(), TraceError> {
        buf.clear();
        while buf.len() < max && self.step < self.steps.len() {
            match self.next_of_step() {
                Some(e) => {
                    if let Event::Touch { .. } = e {
                        if self.sample_every > 0 {
                            self.since_sample += 1;
                            if self.since_sample == self.sample_every {
                                self.since_sample = 0;
                                buf.push(e);
                                buf.push(Event::Sample);
                                continue;
                            }
                        }
                    }
                    buf.push(e);
                }
                None => {
                    self.step += 1;
                    self.pos = 0;
                }
            }
        }
        Ok(())
    }
}

/// The file's magic.
pub const MAGIC: &[u8; 8] = b"MMTRACE\0";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// Header bytes.
pub const HEADER: u64 = 32;
/// The largest page number a record holds.
pub const MAX_PAGE: u64 = (1 << 31) - 1;

/// A trace file's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub footprint: u64,
    pub records: u64,
}

/// Reads and checks the header of `r` (`len` bytes long).
pub fn read_header(r: &mut impl Read, len: u64) -> Result<Header, TraceError> {
    let mut h = [0u8; HEADER as usize];
    if len < HEADER {
        return Err(TraceError(format!(
            "truncated header at byte offset {len}: a trace starts with a {HEADER}-byte header"
        )));
    }
    r.read_exact(&mut h)
        .map_err(|e| TraceError(format!("reading the header at byte offset 0: {e}")))?;
    if &h[0..8] != MAGIC {
        return Err(TraceError(
            "bad magic at byte offset 0: not an mmlab trace (expected MMTRACE)".into(),
        ));
    }
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(8) != VERSION {
        return Err(TraceError(format!(
            "unsupported version {} at byte offset 8 (this mmlab reads version {VERSION})",
            u32_at(8)
        )));
    }
    if u32_at(12) != 0 {
        return Err(TraceError(format!(
            "unknown flags {:#x} at byte offset 12",
            u32_at(12)
        )));
    }
    let (footprint, records) = (u64_at(16), u64_at(24));
    if footprint == 0 || footprint > MAX_PAGE + 1 {
        return Err(TraceError(format!(
            "bad footprint {footprint} at byte offset 16"
        )));
    }
    let want = HEADER + records * 4;
    if len < want {
        let whole = (len - HEADER) / 4;
        return Err(TraceError(format!(
            "truncated at byte offset {}: the header says {records} records, the file \
             holds {whole}{}",
            HEADER + whole * 4,
            if !(len - HEADER).is_multiple_of(4) {
                " and a partial one"
            } else {
                ""
            }
        )));
    }
    if len > want {
        return Err(TraceError(format!(
            "trailing bytes at byte offset {want}: the header says {records} records"
        )));
    }
    Ok(Header { footprint, records })
}

/// Reads the header of the file at `path`.
pub fn file_header(path: &Path) -> Result<Header, TraceError> {
    let f = File::open(path).map_err(|e| TraceError(format!("{}: {e}", path.display())))?;
    let len = f
        .metadata()
        .map_err(|e| TraceError(format!("{}: {e}", path.display())))?
        .len();
    read_header(&mut BufReader::new(f), len)
        .map_err(|e| TraceError(format!("{}: {e}", path.display())))
}

/// A trace file, read in batches.
pub struct FileSource {
    shape: Shape,
    r: BufReader<File>,
    header: Header,
    read: u64,
    started: bool,
    ended: bool,
    name: String,
}

impl FileSource {
    pub fn open(path: &Path, memory_pages: u64) -> Result<FileSource, TraceError> {
        let name = path.display().to_string();
        let f = File::open(path).map_err(|e| TraceError(format!("{name}: {e}")))?;
        let len = f
            .metadata()
            .map_err(|e| TraceError(format!("{name}: {e}")))?
            .len();
        let mut r = BufReader::with_capacity(1 << 16, f);
        let header = read_header(&mut r, len).map_err(|e| TraceError(format!("{name}: {e}")))?;
        Ok(FileSource {
            shape: Shape {
                pages: header.footprint,
                segment_pages: header.footprint,
                memory_pages,
                accesses_per_unit: 1.0,
            },
            r,
            header,
            read: 0,
            started: false,
            ended: false,
            name,
        })
    }
}

impl Source for FileSource {
    fn shape(&self) -> &Shape {
        &self.shape
    }

    fn fill(&mut self, buf: &mut Vec<Event>, max: usize) -> Result<(), TraceError> {
        buf.clear();
        if !self.started {
            // The whole trace is measured: a real program's first touches
            // are zero fills, not device reads, on every peer.
            self.started = true;
            buf.push(Event::Measure(true));
        }
        let mut rec = [0u8; 4];
        while buf.len() < max && self.read < self.header.records {
            let off = HEADER + self.read * 4;
            self.r.read_exact(&mut rec).map_err(|e| {
                TraceError(format!(
                    "{}: truncated at byte offset {off}: {e}",
                    self.name
                ))
            })?;
            let v = u32::from_le_bytes(rec);
            let page = u64::from(v >> 1);
            if page >= self.header.footprint {
                return Err(TraceError(format!(
                    "{}: page {page} at byte offset {off} is not below the footprint {}",
                    self.name, self.header.footprint
                )));
            }
            buf.push(Event::Touch {
                page,
                write: v & 1 == 1,
            });
            self.read += 1;
        }
        if self.read == self.header.records && !self.ended && buf.len() < max {
            self.ended = true;
            buf.push(Event::Measure(false));
        }
        Ok(())
    }
}

/// Writes a trace file: records streamed, the header completed by `finish`.
pub struct TraceWriter {
    w: BufWriter<File>,
    footprint: u64,
    records: u64,
}

impl TraceWriter {
    pub fn create(path: &Path) -> std::io::Result<TraceWriter> {
        let mut w = BufWriter::new(File::create(path)?);
        w.write_all(&[0u8; HEADER as usize])?;
        Ok(TraceWriter {
            w,
            footprint: 0,
            records: 0,
        })
    }

    /// One record: `page` (dense, at most `MAX_PAGE`), a write if `write`.
    pub fn push(&mut self, page: u64, write: bool) -> std::io::Result<()> {
        if page > MAX_PAGE {
            return Err(std::io::Error::other(format!(
                "page {page} above the format's limit {MAX_PAGE}"
            )));
        }
        self.footprint = self.footprint.max(page + 1);
        self.records += 1;
        let v = ((page as u32) << 1) | u32::from(write);
        self.w.write_all(&v.to_le_bytes())
    }

    /// Writes the header; returns (footprint, records).
    pub fn finish(mut self) -> std::io::Result<Header> {
        let mut h = Vec::with_capacity(HEADER as usize);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&self.footprint.max(1).to_le_bytes());
        h.extend_from_slice(&self.records.to_le_bytes());
        self.w.flush()?;
        let mut f = self.w.into_inner().map_err(|e| e.into_error())?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&h)?;
        f.sync_all()?;
        Ok(Header {
            footprint: self.footprint.max(1),
            records: self.records,
        })
    }
}
