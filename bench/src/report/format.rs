//! How the report writes numbers: rates with thousands separators, milliseconds
//! and ratios with sensible precision, "–" for a number that is missing; and
//! the cells and heads its tables share.

use std::fmt::{self, Display, Write as _};

use crate::analysis::statistics::Summary;

/// A table's head: `| first | c1 | c2 | .. |`, then its alignment row, `first`
/// left-aligned and the columns right-aligned (numbers).
pub(super) fn table_head<C: Display>(
    w: &mut String,
    first: &str,
    columns: impl ExactSizeIterator<Item = C>,
) -> fmt::Result {
    let n = columns.len();
    write!(w, "| {first} |")?;
    for c in columns {
        write!(w, " {c} |")?;
    }
    writeln!(w)?;
    writeln!(w, "| --- |{}", " ---: |".repeat(n))
}

/// "–" for a number that is missing (not finite), else `show(v)`.
fn or_dash(v: f64, show: impl FnOnce(f64) -> String) -> String {
    if v.is_finite() {
        show(v)
    } else {
        "–".into()
    }
}

/// `12,345`.
pub(super) fn rate(v: f64) -> String {
    or_dash(v, |v| {
        let n = v.round() as i64;
        let digits = n.abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        if n < 0 {
            format!("-{out}")
        } else {
            out
        }
    })
}

/// Milliseconds with sensible precision.
pub(super) fn ms(v: f64) -> String {
    or_dash(v, |v| match v {
        v if v < 1.0 => format!("{v:.2}"),
        v if v < 100.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    })
}

pub(super) fn ratio(v: f64) -> String {
    or_dash(v, |v| format!("{v:.2}"))
}

/// Whether the ratio `v` misses `target` as the report prints it ([`ratio`],
/// two decimals): a ratio shown as the target is not listed below it.
pub(super) fn below(v: f64, target: f64) -> bool {
    (v * 100.0).round() / 100.0 < target
}

pub(super) fn num(v: f64) -> String {
    or_dash(v, |v| {
        if v == v.round() {
            rate(v)
        } else {
            format!("{v:.1}")
        }
    })
}

pub(super) fn us(v: f64) -> String {
    or_dash(v, |v| format!("{v:.0}"))
}

/// The cells `lockkit /s | hand-written /s | lockkit / hand` of a pair's row,
/// `r` the pair's ratio.
pub(super) fn pair_cells(lockkit: &Summary, hand: &Summary, r: f64) -> String {
    format!(
        "{} | {} | {}",
        rate(lockkit.throughput),
        rate(hand.throughput),
        ratio(r)
    )
}

/// The cells `p50 ms | p99 ms | attempts / success | deadlocks | correctness`
/// of a row.
pub(super) fn outcome_cells(s: &Summary) -> String {
    format!(
        "{} | {} | {:.2} | {} | {}",
        ms(s.p50_ms),
        ms(s.p99_ms),
        s.attempts_per_success,
        num(s.deadlocks),
        check_cell(s)
    )
}

/// The correctness cell of a summary.
pub(super) fn check_cell(s: &Summary) -> String {
    if s.checks_ok == s.runs {
        format!(
            "✅ {}{}",
            s.detail,
            if s.slices > s.runs {
                format!(" (one of {} checked runs)", s.slices)
            } else {
                String::new()
            }
        )
    } else if !s.case.strategy.is_safe() {
        format!("❌ {} lost updates per run ({})", num(s.lost), s.detail)
    } else {
        format!(
            "❌ FAILED in {} of {} runs: {}",
            s.runs - s.checks_ok,
            s.runs,
            s.detail
        )
    }
}
