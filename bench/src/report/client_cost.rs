//! "What lockkit itself costs": time and allocations per call (in-memory
//! SQLite) and where the extra client work goes.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{rate, ratio};
use crate::analysis::ratios::overhead;
use crate::analysis::statistics::median;
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    if results.profile.is_empty() && results.callgrind.is_empty() {
        return Ok(());
    }
    writeln!(w, "## What lockkit itself costs\n")?;
    if !results.profile.is_empty() {
        writeln!(
            w,
            "Each call and its twin on one in-memory SQLite connection, one thread: no network \
             and no disk to hide the library's own time.\n"
        )?;
        writeln!(
            w,
            "| call | lockkit ns | compared with | ns | lockkit / other time | lockkit allocations | other allocations |"
        )?;
        writeln!(w, "| --- | ---: | --- | ---: | ---: | ---: | ---: |")?;
        for r in &results.profile {
            writeln!(
                w,
                "| `{}` | {} | {} | {} | {:.2} | {:.1} | {:.1} |",
                r.name,
                rate(r.lockkit_ns),
                r.other_title,
                rate(r.other_ns),
                r.lockkit_ns / r.other_ns,
                r.lockkit_allocs,
                r.other_allocs
            )?;
        }
        writeln!(w)?;
    }
    let extra = |name: &str, backend: Backend| {
        results
            .callgrind
            .iter()
            .find(|r| r.name == name && r.backend == backend && r.other_title == "hand-written")
            .map(|r| (r.lockkit - r.other, (r.lockkit / r.other - 1.0) * 100.0))
    };
    let mut notes = Vec::new();
    let cacheable_profile = results
        .profile
        .iter()
        .find(|r| r.other.flavor == crate::vocabulary::Flavor::HandCached);
    let cacheable_cg: Vec<String> = results
        .callgrind
        .iter()
        .filter(|r| r.other_title == "hand-written, cacheable")
        .map(|r| {
            format!(
                "{} {} → {}",
                report_name(r.backend),
                rate(r.lockkit),
                rate(r.other)
            )
        })
        .collect();
    if let Some(p) = cacheable_profile {
        notes.push(format!(
            "* **lockkit's versioned `UPDATE` is prepared once per connection; a hand-written \
             one is prepared on every call.** Diesel 2.3 marks every `UpdateStatement` unsafe to \
             cache (a changeset with `Option` fields changes its SQL between calls), so SQLite \
             compiles each hand-written `UPDATE` again, PostgreSQL parses and plans it again \
             (unnamed statement) and MySQL spends a prepare round trip on it. lockkit's \
             versioned writes are its own statement (`lockkit::optimistic::statement`), which \
             Diesel caches by type when the model's changeset cannot vary (by SQL text when an \
             `Option` field may be skipped). A hand-built cacheable statement \
             (`CacheableVersionedUpdate` in `bench/src/run/ops/versioned.rs`) takes {} ns and \
             {:.0} allocations where `update_versioned` takes {} ns and {:.0}{}.",
            rate(p.other_ns),
            p.other_allocs,
            rate(p.lockkit_ns),
            p.lockkit_allocs,
            if cacheable_cg.is_empty() {
                String::new()
            } else {
                format!(
                    "; client instructions per call, lockkit → cacheable: {}",
                    cacheable_cg.join(", ")
                )
            }
        ));
    }
    let nested: Vec<String> = [Backend::Postgres, Backend::Mysql, Backend::Sqlite]
        .iter()
        .filter_map(|&b| {
            extra("update_versioned", b)
                .filter(|(d, _)| *d > 200.0)
                .map(|(d, p)| format!("{} {} ({p:+.1}%)", report_name(b), rate(d)))
        })
        .collect();
    if !nested.is_empty() {
        notes.push(format!(
            "* **`update_versioned` against the same hand-written `UPDATE`: {} more \
             instructions per call.** lockkit sets `(changeset, bump)`, a tuple nested in a \
             tuple. Diesel's tuple `QueryFragment` asks every element `is_noop()` before writing \
             a separating comma, and for an inner tuple that is a walk of its own, so the \
             model's fields are walked once more on each of Diesel's passes over the statement \
             (the hand-written `UPDATE` written with the same nested tuple counts the same as \
             lockkit's). Fix in lockkit: let `#[derive(Versioned)]` emit, for \
             `update_versioned`, one flat tuple with the bump as its last element.",
            nested.join(", ")
        ));
    }
    let lock_extra: Vec<String> = [Backend::Postgres, Backend::Mysql]
        .iter()
        .filter_map(|&b| {
            extra("with_lock", b).map(|(d, p)| format!("{} {} ({p:+.1}%)", report_name(b), rate(d)))
        })
        .collect();
    if !lock_extra.is_empty() {
        notes.push(format!(
            "* **`with_lock`, `lock_all`, `queue::claim` on the servers: {} more instructions \
             per call.** The common lock clauses (`FOR UPDATE`, `FOR UPDATE NOWAIT`, \
             `FOR UPDATE SKIP LOCKED`, `FOR SHARE`) are zero-sized types with static `QueryId`s \
             (`lockkit::pessimistic::row_lock::LockClause`), so Diesel finds their prepared \
             statements by type, as for its own `.for_update()`; the other clauses are a \
             run-time `RowLock`, found by their SQL text. The rest is the work around the \
             statement (the transaction, the version bump of a versioned model).",
            lock_extra.join(", ")
        ));
    }
    let stale: Vec<(Backend, f64, f64)> = [Backend::Postgres, Backend::Mysql]
        .iter()
        .filter_map(|&b| {
            let case = Case::new(Workload::HotRow, Strategy::Optimistic, 16);
            let (r, _, _) = overhead(results, b, &case)?;
            let per_success: Vec<f64> = results
                .samples
                .iter()
                .filter(|s| s.backend == b && s.case == case && s.counts.successes > 0)
                .map(|s| s.counts.stale as f64 / s.counts.successes as f64)
                .collect();
            Some((b, r, median(&per_success)))
        })
        .collect();
    if stale.iter().any(|(_, r, _)| *r < 0.98) {
        notes.push(format!(
            "* **After a stale write lockkit reads the row's current version for its error \
             report** (the sequence's `Step::ReadCurrent` → `load_current_version`): one more round trip \
             per conflict, the one statement lockkit sends that its hand-written twin does not, \
             and the likely reason why optimistic + retry at 16 workers trails its twin ({}). \
             Fix in lockkit: make that read lazy (keep the key in `StaleObjectError` and read \
             the current state on demand), or skip it while `retry` will try again anyway.",
            stale
                .iter()
                .map(|(b, r, c)| format!(
                    "{}: lockkit / hand-written {}, {c:.2} conflicts per update",
                    report_name(*b),
                    ratio(*r)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // The profile row of `strategy`, when lockkit took more than `factor` times
    // the time of what it is compared with.
    let slower = |strategy: Strategy, factor: f64| {
        results
            .profile
            .iter()
            .find(|r| r.lockkit.strategy == strategy)
            .filter(|r| r.lockkit_ns > r.other_ns * factor)
    };
    if let Some(r) = slower(Strategy::LockAll, 1.2) {
        notes.push(format!(
            "* **`lock_all` on SQLite: {:.1}× the time of locking the same rows one by one \
                 (in-memory SQLite).** Not its statement: the `IN (..)` list is padded to 1, 2, 4, \
                 .. keys (`lockkit::pessimistic::lockable::KeyList`), so each length is prepared \
                 once and cached, as the row-by-row `SELECT` is. It is what `lock_all` does \
                 beyond the locked read: it advances the version of every row it locks (`Item` is \
                 `Versioned`: one more `UPDATE` per row, where row by row only reads), and sorts \
                 and dedups the keys.",
            r.lockkit_ns / r.other_ns
        ));
    }
    if let Some(r) = slower(Strategy::Nowait, 1.1) {
        notes.push(format!(
            "* **`with_lock(nowait)` on SQLite: {:.0}% slower than `with_lock` and {:.0} \
                 more allocations.** SQLite has no `NOWAIT`, so `locked_transaction` reads \
                 `PRAGMA busy_timeout`, sets it to 0 in the batch that takes the write lock \
                 and restores it afterwards: two extra statements per transaction. (The MySQL \
                 timeout path keeps the session's `innodb_lock_wait_timeout` in a session \
                 variable as it sets the new one, and puts it back after: two round trips.)",
            (r.lockkit_ns / r.other_ns - 1.0) * 100.0,
            r.lockkit_allocs - r.other_allocs
        ));
    }
    if !notes.is_empty() {
        writeln!(
            w,
            "Where lockkit's extra client work goes (callgrind, `--profile-only`):\n"
        )?;
        for n in notes {
            writeln!(w, "{n}")?;
        }
        writeln!(
            w,
            "\nThe first changes the server's work too (a parse and plan per `UPDATE` on \
             PostgreSQL, a prepare round trip on MySQL); the others are client CPU, a few µs per \
             call: within this machine's noise on the throughput ratios above, visible when the \
             client's CPU is the limit.\n"
        )?;
    }
    Ok(())
}
