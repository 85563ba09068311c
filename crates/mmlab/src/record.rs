//! The lab's unit of output: one `Record` per figure, written as one JSON Lines
//! row, e.g.
//! `{"workload":"alloc_free","variant":"mmkit","threads":2,"metric":"ops_per_sec","value":3.1e6,"unit":"1/s"}`
//! with an optional `"case"` (a sub-case name) and an optional `"params"` object
//! (the settings the figure was measured with). Field order is the declaration order.

use serde::{Deserialize, Serialize};
use std::io::Write;

/// One measured figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub workload: String,
    pub variant: String,
    pub threads: usize,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
    /// The value of every round, in run order, when a point ran more than one
    /// round (`value` is their median); `mmlab compare` takes the spread from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<Vec<f64>>,
}

impl Record {
    /// The spread of the rounds, max - min (0 without rounds).
    pub fn spread(&self) -> f64 {
        match &self.rounds {
            Some(r) if !r.is_empty() => {
                let max = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let min = r.iter().copied().fold(f64::INFINITY, f64::min);
                max - min
            }
            _ => 0.0,
        }
    }
}

impl Record {
    /// The record as one JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        // A Record holds only strings, integers, finite-or-null floats and maps:
        // serialization cannot fail.
        serde_json::to_string(self).expect("Record serializes")
    }
}

/// Writes `records` as JSON Lines to `w`.
pub fn write_jsonl<W: Write>(mut w: W, records: &[Record]) -> std::io::Result<()> {
    for r in records {
        writeln!(w, "{}", r.to_json_line())?;
    }
    w.flush()
}

/// The value of one figure, if it was measured.
pub fn lookup(
    records: &[Record],
    workload: &str,
    variant: &str,
    threads: usize,
    metric: &str,
) -> Option<f64> {
    records
        .iter()
        .find(|r| {
            r.workload == workload
                && r.variant == variant
                && r.threads == threads
                && r.metric == metric
                && r.case.is_none()
        })
        .map(|r| r.value)
}

/// The value of one figure of sub-case `case`, if it was measured.
pub fn lookup_case(
    records: &[Record],
    workload: &str,
    variant: &str,
    threads: usize,
    metric: &str,
    case: &str,
) -> Option<f64> {
    records
        .iter()
        .find(|r| {
            r.workload == workload
                && r.variant == variant
                && r.threads == threads
                && r.metric == metric
                && r.case.as_deref() == Some(case)
        })
        .map(|r| r.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            workload: "alloc_free".into(),
            variant: "mmkit".into(),
            threads: 2,
            metric: "ops_per_sec".into(),
            value: 3.1e6,
            unit: "1/s".into(),
            case: None,
            params: None,
            rounds: None,
        }
    }

    #[test]
    fn json_shape_without_optional_fields() {
        let line = sample().to_json_line();
        assert_eq!(
            line,
            r#"{"workload":"alloc_free","variant":"mmkit","threads":2,"metric":"ops_per_sec","value":3100000.0,"unit":"1/s"}"#
        );
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn json_shape_with_case_and_params() {
        let mut r = sample();
        r.case = Some("2MiB".into());
        let mut p = serde_json::Map::new();
        p.insert("batch".into(), 512.into());
        r.params = Some(p);
        let v: serde_json::Value = serde_json::from_str(&r.to_json_line()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "workload", "variant", "threads", "metric", "value", "unit", "case", "params",
        ] {
            assert!(keys.contains(&k), "missing {k}");
        }
        assert_eq!(v["case"], "2MiB");
        assert_eq!(v["params"]["batch"], 512);
        assert_eq!(v["threads"], 2);
        assert!(v["value"].is_f64());
    }

    #[test]
    fn jsonl_is_one_line_per_record() {
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &[sample(), sample()]).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn lookup_finds_the_figure() {
        let recs = vec![sample()];
        assert_eq!(
            lookup(&recs, "alloc_free", "mmkit", 2, "ops_per_sec"),
            Some(3.1e6)
        );
        assert_eq!(lookup(&recs, "alloc_free", "mmkit", 4, "ops_per_sec"), None);
        let mut r = sample();
        r.case = Some("2MiB".into());
        let recs = vec![sample(), r];
        assert_eq!(
            lookup_case(&recs, "alloc_free", "mmkit", 2, "ops_per_sec", "2MiB"),
            Some(3.1e6)
        );
        assert_eq!(
            lookup_case(&recs, "alloc_free", "mmkit", 2, "ops_per_sec", "1GiB"),
            None
        );
    }
}
