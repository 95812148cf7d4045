//! How the report writes numbers: rates with thousands separators, milliseconds
//! and ratios with sensible precision, "–" for a number that is missing.

use crate::analysis::statistics::Summary;

/// `12,345`.
pub(super) fn rate(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
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
}

/// Milliseconds with sensible precision.
pub(super) fn ms(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v < 1.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub(super) fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".into()
    }
}

pub(super) fn num(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v == v.round() {
        rate(v)
    } else {
        format!("{v:.1}")
    }
}

pub(super) fn us(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "–".into()
    }
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
