//! Custom variants from the command line: `--set merge=eager,pcp_high=fixed` builds
//! mmkit with the default policies (the `mmkit` variant's) changed by the listed
//! settings, and names the column after them: `set:merge=eager,pcp_high=fixed`.
//!
//! The settable keys are one table, `KEYS`: a row is a key, its group, its values
//! and the `MmBuilder` call that applies it. Adding a policy (swap, NUMA) is one
//! row; `mmlab list` and the error messages are made from the table.

use mmkit::{
    ClearStrategy, LoadControl, LruPolicy, MergePolicy, MmBuilder, PcpHighPolicy, PcpPolicy,
    RefillPolicy, SwapAllocPolicy, SwapCacheIndex, SwapFreePolicy, SwapReadahead, Variant,
};
use serde_json::{Map, Value as Json};

/// The prefix of a custom variant's name.
pub const PREFIX: &str = "set:";

/// The values a key takes.
#[derive(Debug)]
pub enum Values {
    /// One of these names.
    Names(&'static [&'static str]),
    /// An integer in `min..=max`.
    Range { min: u64, max: u64 },
}

/// A parsed value: one of the key's names, or an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Name(&'static str),
    Num(u64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Name(n) => f.write_str(n),
            Value::Num(n) => write!(f, "{n}"),
        }
    }
}

/// One settable key.
pub struct Key {
    pub name: &'static str,
    /// What it belongs to: `pcp`, `buddy`, `fault`, `compaction`, `arena`,
    /// `swap` (later `numa`).
    pub group: &'static str,
    pub values: Values,
    /// The value of the `mmkit` variant (what an unset key is).
    pub default: &'static str,
    pub description: &'static str,
    /// Applies a value (one of `values`, checked by the parser) to the builder.
    apply: fn(MmBuilder, Value) -> MmBuilder,
}

const ON_OFF: &[&str] = &["on", "off"];

fn on(v: Value) -> bool {
    v == Value::Name("on")
}

/// `a` if the value is the name `first`, else `b` (a key of two values).
fn pick<T>(v: Value, first: &'static str, a: T, b: T) -> T {
    if v == Value::Name(first) {
        a
    } else {
        b
    }
}

fn num(v: Value) -> u64 {
    match v {
        Value::Num(n) => n,
        Value::Name(_) => 0,
    }
}

/// The named presets `base=` starts from.
const BASES: &[&str] = &[
    "mmkit",
    "mmkit-eager",
    "mmkit-nopcp",
    "mmkit-nomerge",
    "mmkit-swap-2019",
    "mmkit-swap-2020",
    "mmkit-swap-6.18",
    "mmkit-lru-classic",
    "mmkit-loadctl",
];

/// Every settable key, in `mmlab list` order.
pub const KEYS: &[Key] = &[
    Key {
        name: "base",
        group: "preset",
        values: Values::Names(BASES),
        default: "mmkit",
        description: "the named variant the other settings change (applied first, wherever it \
                      is written)",
        apply: |b, v| match v {
            Value::Name(n) => match Variant::from_name(n) {
                Some(p) => b.variant(p),
                None => b,
            },
            Value::Num(_) => b,
        },
    },
    Key {
        name: "pcp",
        group: "pcp",
        values: Values::Names(ON_OFF),
        default: "on",
        description: "per-CPU page lists for orders 0..=3 (off: every call takes the zone lock)",
        apply: |b, v| b.pcp(pick(v, "on", PcpPolicy::On, PcpPolicy::Off)),
    },
    Key {
        name: "pcp_high",
        group: "pcp",
        values: Values::Names(&["fixed", "auto"]),
        default: "auto",
        description: "per-CPU high: fixed 6 * batch (Linux before 6.7) or auto-tuned (6.7)",
        apply: |b, v| b.pcp_high(pick(v, "fixed", PcpHighPolicy::Fixed, PcpHighPolicy::Auto)),
    },
    Key {
        name: "pcp_batch",
        group: "pcp",
        values: Values::Range { min: 1, max: 4096 },
        default: "derived from the zone size",
        description: "per-CPU batch in pages",
        apply: |b, v| b.pcp_batch(u32::try_from(num(v)).unwrap_or(u32::MAX)),
    },
    Key {
        name: "pcp_cache",
        group: "pcp",
        values: Values::Names(ON_OFF),
        default: "on",
        description: "the lock-free rseq per-CPU order-0 caches in front of the lists",
        apply: |b, v| b.pcp_cache(on(v)),
    },
    Key {
        name: "merge",
        group: "buddy",
        values: Values::Names(&["eager", "lazy", "lazy-nomerge"]),
        default: "lazy",
        description: "buddy merging: on every free, lazy for order 0 with merge on demand, or \
                      lazy without merge on demand",
        apply: |b, v| {
            b.merge(match v {
                Value::Name("eager") => MergePolicy::Eager,
                Value::Name("lazy-nomerge") => MergePolicy::LazyNoMerge,
                _ => MergePolicy::Lazy,
            })
        },
    },
    Key {
        name: "refill",
        group: "buddy",
        values: Values::Names(&["page-by-page", "cluster"]),
        default: "cluster",
        description: "per-CPU refill: one buddy allocation per page, or contiguous runs",
        apply: |b, v| {
            b.refill(pick(
                v,
                "page-by-page",
                RefillPolicy::PageByPage,
                RefillPolicy::Cluster,
            ))
        },
    },
    Key {
        name: "clear",
        group: "fault",
        values: Values::Names(&["page-at-a-time", "multi-page", "non-temporal", "auto"]),
        default: "auto",
        description: "how pages are cleared (Gfp::ZERO and the fault path)",
        apply: |b, v| match v {
            Value::Name(n) => b.clear(ClearStrategy::from_name(n).unwrap_or_default()),
            Value::Num(_) => b,
        },
    },
    Key {
        name: "fault_around",
        group: "fault",
        values: Values::Range { min: 1, max: 64 },
        default: "16",
        description: "anonymous fault-around batch in pages (1: off, Linux's behaviour)",
        apply: |b, v| b.fault_around(usize::try_from(num(v)).unwrap_or(1)),
    },
    Key {
        name: "compaction",
        group: "compaction",
        values: Values::Names(ON_OFF),
        default: "on",
        description: "direct compaction in the slow path of high-order allocations",
        apply: |b, v| b.compaction(on(v)),
    },
    Key {
        name: "kcompactd",
        group: "compaction",
        values: Values::Names(ON_OFF),
        default: "on",
        description: "the background compaction thread",
        apply: |b, v| b.kcompactd(on(v)),
    },
    Key {
        name: "compaction_proactiveness",
        group: "compaction",
        values: Values::Range { min: 0, max: 100 },
        default: "20",
        description: "vm.compaction_proactiveness (0: no proactive compaction)",
        apply: |b, v| b.compaction_proactiveness(u32::try_from(num(v)).unwrap_or(100)),
    },
    Key {
        name: "hugetlb",
        group: "arena",
        values: Values::Names(ON_OFF),
        default: "off",
        description: "back the arena with hugetlb pages (falls back to THP when refused)",
        apply: |b, v| b.hugetlb(on(v)),
    },
    Key {
        name: "swap_alloc",
        group: "swap",
        values: Values::Names(&["shared-cursor", "percpu-cursor", "percpu-cluster"]),
        default: "percpu-cluster",
        description: "swap-slot allocation: one shared scan cursor (Linux before the per-CPU swap-slot cursors), \
                      per-CPU cursors jumping to random trunks (the seed), per-CPU clusters (6.15)",
        apply: |b, v| {
            b.swap_alloc(match v {
                Value::Name("shared-cursor") => SwapAllocPolicy::SharedCursor,
                Value::Name("percpu-cursor") => SwapAllocPolicy::PerCpuCursor,
                _ => SwapAllocPolicy::PerCpuCluster,
            })
        },
    },
    Key {
        name: "swap_cache",
        group: "swap",
        values: Values::Names(&["trunks", "table"]),
        default: "table",
        description: "swap-cache index: a locked index per 64 MiB (Linux until 6.17) or the \
                      per-cluster table of atomic entries (6.18)",
        apply: |b, v| {
            b.swap_cache(pick(
                v,
                "trunks",
                SwapCacheIndex::Trunks,
                SwapCacheIndex::Table,
            ))
        },
    },
    Key {
        name: "swap_free",
        group: "swap",
        values: Values::Names(&["half-full", "keep-while-room"]),
        default: "keep-while-room",
        description: "when a page read back from swap frees its slot: once swap is half full \
                      (Linux) or only when the free slots no longer cover the resident pages",
        apply: |b, v| {
            b.swap_free(pick(
                v,
                "half-full",
                SwapFreePolicy::HalfFull,
                SwapFreePolicy::KeepWhileRoom,
            ))
        },
    },
    Key {
        name: "swap_ra",
        group: "swap",
        values: Values::Names(&["off", "cluster", "vma"]),
        default: "vma",
        description: "swap readahead: none, the next slots of the cluster, or the next PTEs' \
                      entries (Linux's default), with Linux's adaptive window",
        apply: |b, v| {
            b.swap_readahead(match v {
                Value::Name("off") => SwapReadahead::Off,
                Value::Name("cluster") => SwapReadahead::Cluster,
                _ => SwapReadahead::Vma,
            })
        },
    },
    Key {
        name: "lru",
        group: "swap",
        values: Values::Names(&["single", "sharded"]),
        default: "sharded",
        description: "anonymous LRU lists: one pair per node under one lock (Linux) or sharded \
                      per CPU",
        apply: |b, v| b.lru_sharded(!matches!(v, Value::Name("single"))),
    },
    Key {
        name: "lru_policy",
        group: "swap",
        values: Values::Names(&["protected", "classic"]),
        default: "protected",
        description: "anonymous LRU eviction: a probation FIFO feeding a protected clock with \
                      refault shadows (mmkit), or Linux 6.18's classic active/inactive rules",
        apply: |b, v| b.lru_policy(pick(v, "classic", LruPolicy::Classic, LruPolicy::Protected)),
    },
    Key {
        name: "load_control",
        group: "swap",
        values: Values::Names(&["off", "working_set", "swap_token"]),
        default: "off",
        description: "when address spaces thrash: every space runs, groups whose working \
                      sets fit take turns (working-set load control), or one space at a time \
                      keeps its set while the others run in the rest (the swap token)",
        apply: |b, v| {
            b.load_control(match v {
                Value::Name("working_set") => LoadControl::WorkingSet,
                Value::Name("swap_token") => LoadControl::SwapToken,
                _ => LoadControl::Off,
            })
        },
    },
];

impl Key {
    /// The values as `mmlab list` and the errors print them: `on|off`, `1..=64`.
    pub fn values_text(&self) -> String {
        match &self.values {
            Values::Names(n) => n.join("|"),
            Values::Range { min, max } => format!("{min}..={max}"),
        }
    }

    fn parse_value(&self, s: &str) -> Result<Value, String> {
        let bad = || {
            format!(
                "bad value {s:?} for --set key {}; values: {}",
                self.name,
                self.values_text()
            )
        };
        match &self.values {
            Values::Names(names) => names
                .iter()
                .find(|n| n.eq_ignore_ascii_case(s))
                .map(|n| Value::Name(n))
                .ok_or_else(bad),
            Values::Range { min, max } => match s.parse::<u64>() {
                Ok(n) if (*min..=*max).contains(&n) => Ok(Value::Num(n)),
                _ => Err(bad()),
            },
        }
    }
}

/// The key called `name` (`-` and `_` are the same).
pub fn key(name: &str) -> Option<&'static Key> {
    let n = name.replace('-', "_");
    KEYS.iter().find(|k| k.name.eq_ignore_ascii_case(&n))
}

/// The settings of one custom variant, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pairs: Vec<(&'static str, Value)>,
}

impl Settings {
    /// Parses `key=value[,key=value...]`. Unknown keys, bad values, repeated keys
    /// and empty settings are errors that list what is valid.
    pub fn parse(s: &str) -> Result<Settings, String> {
        let s = s.strip_prefix(PREFIX).unwrap_or(s);
        let mut pairs: Vec<(&'static str, Value)> = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!(
                    "empty setting in {s:?}; write key=value[,key=value...], keys: {}",
                    key_names()
                ));
            }
            let Some((k, v)) = part.split_once('=') else {
                return Err(format!(
                    "{part:?} is not key=value; keys: {} (`mmlab list` shows their values)",
                    key_names()
                ));
            };
            let key = key(k.trim()).ok_or_else(|| {
                format!(
                    "unknown --set key {:?}; keys: {} (`mmlab list` shows their values)",
                    k.trim(),
                    key_names()
                )
            })?;
            if pairs.iter().any(|(n, _)| *n == key.name) {
                return Err(format!("--set key {} given twice in {s:?}", key.name));
            }
            pairs.push((key.name, key.parse_value(v.trim())?));
        }
        Ok(Settings { pairs })
    }

    /// The variant name: `set:` and the settings, canonically spelled.
    pub fn name(&self) -> String {
        let parts: Vec<String> = self.pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{PREFIX}{}", parts.join(","))
    }

    /// The settings as a JSON object, for the records' params.
    pub fn to_json(&self) -> Map<String, Json> {
        self.pairs
            .iter()
            .map(|(k, v)| {
                let j = match v {
                    Value::Name(n) => Json::from(*n),
                    Value::Num(n) => Json::from(*n),
                };
                (k.to_string(), j)
            })
            .collect()
    }

    /// `builder` (the `mmkit` variant's defaults) with these settings: `base` first,
    /// then the others in order.
    pub fn apply(&self, builder: MmBuilder) -> MmBuilder {
        let keyed = |name: &str| KEYS.iter().find(|k| k.name == name);
        let (base, rest): (Vec<_>, Vec<_>) = self.pairs.iter().partition(|(k, _)| *k == "base");
        base.iter()
            .chain(&rest)
            .fold(builder, |b, (k, v)| match keyed(k) {
                Some(key) => (key.apply)(b, *v),
                None => b,
            })
    }
}

/// Whether `name` is a custom variant's name.
pub fn is_custom(name: &str) -> bool {
    name.starts_with(PREFIX)
}

fn key_names() -> String {
    KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// The key table as `mmlab list` prints it.
pub fn list_text() -> String {
    let mut s = String::from(
        "settings (--set key=value[,key=value...]; a custom variant named set:...):\n",
    );
    for k in KEYS {
        s += &format!(
            "  {:<26} {} [default {}; {}]\n  {:<26} {}\n",
            k.name,
            k.values_text(),
            k.default,
            k.group,
            "",
            k.description
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid value of every key, and one it refuses.
    fn sample(k: &Key) -> (String, String) {
        match &k.values {
            Values::Names(n) => (n[n.len() - 1].to_string(), "bogus".into()),
            Values::Range { min, max } => (min.to_string(), (max + 1).to_string()),
        }
    }

    #[test]
    fn every_key_parses_and_builds() {
        for k in KEYS {
            let values: Vec<String> = match &k.values {
                Values::Names(n) => n.iter().map(|s| s.to_string()).collect(),
                Values::Range { min, max } => vec![min.to_string(), max.to_string()],
            };
            for v in values {
                let s = Settings::parse(&format!("{}={v}", k.name)).unwrap();
                assert_eq!(s.name(), format!("set:{}={v}", k.name));
                assert_eq!(s.to_json().len(), 1);
                // Applying must not panic; building a small arena proves the
                // builder accepts it (hugetlb may fall back to THP).
                let mm = s.apply(mmkit::Mm::builder().memory(8 << 20)).build();
                assert!(mm.is_ok(), "{}={v}: {:?}", k.name, mm.err());
            }
            let (_, bad) = sample(k);
            let e = Settings::parse(&format!("{}={bad}", k.name)).unwrap_err();
            assert!(e.contains(&k.values_text()), "{e}");
        }
    }

    #[test]
    fn several_settings_keep_their_order() {
        let s = Settings::parse("merge=eager, pcp_high=fixed,fault-around=1").unwrap();
        assert_eq!(s.name(), "set:merge=eager,pcp_high=fixed,fault_around=1");
        assert_eq!(Settings::parse(&s.name()).unwrap(), s);
        let j = s.to_json();
        assert_eq!(j["merge"], "eager");
        assert_eq!(j["fault_around"], 1);
        assert_eq!(
            Settings::parse("PCP=OFF").unwrap().name(),
            "set:pcp=off",
            "case is ignored"
        );
    }

    #[test]
    fn bad_input_lists_what_is_valid() {
        let e = Settings::parse("mrge=eager").unwrap_err();
        assert!(
            e.contains("unknown --set key") && e.contains("merge, refill"),
            "{e}"
        );
        let e = Settings::parse("merge=sometimes").unwrap_err();
        assert!(e.contains("eager|lazy|lazy-nomerge"), "{e}");
        let e = Settings::parse("fault_around=0").unwrap_err();
        assert!(e.contains("1..=64"), "{e}");
        let e = Settings::parse("fault_around=x").unwrap_err();
        assert!(e.contains("1..=64"), "{e}");
        assert!(Settings::parse("").unwrap_err().contains("empty"));
        assert!(Settings::parse("merge=eager,")
            .unwrap_err()
            .contains("empty"));
        assert!(Settings::parse("merge").unwrap_err().contains("key=value"));
        assert!(Settings::parse("pcp=on,pcp=off")
            .unwrap_err()
            .contains("twice"));
    }

    #[test]
    fn base_applies_first() {
        // fault_around=4 then base=mmkit-eager: the preset must not undo it.
        let s = Settings::parse("fault_around=4,base=mmkit-eager").unwrap();
        let got = format!("{:?}", s.apply(mmkit::Mm::builder()));
        let want = mmkit::Mm::builder()
            .variant(Variant::MmkitEager)
            .fault_around(4);
        assert_eq!(got, format!("{want:?}"));
        let not = mmkit::Mm::builder()
            .fault_around(4)
            .variant(Variant::MmkitEager);
        assert_ne!(got, format!("{not:?}"), "the preset resets fault-around");
    }

    #[test]
    fn list_names_every_key() {
        let t = list_text();
        for k in KEYS {
            assert!(t.contains(k.name) && t.contains(&k.values_text()));
        }
        assert!(is_custom("set:pcp=off") && !is_custom("mmkit"));
    }
}
