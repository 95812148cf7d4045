//! "Machine and servers": what the numbers were measured on.

use std::fmt::{self, Write as _};

use super::context::Report;
use crate::vocabulary::report_name;

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let m = &results.machine;
    writeln!(w, "## Machine and servers\n")?;
    writeln!(
        w,
        "* **Machine**: {} CPUs (`nproc`), {} memory, {}, Linux {}.",
        m.cpus, m.memory, m.cpu_model, m.kernel
    )?;
    writeln!(
        w,
        "* **Load average** (1, 5, 15 min) before the run: {}; after: {}. Other work on the \
         machine shows up here; the interleaved pairs and medians are there to absorb it.",
        m.load_before, m.load_after
    )?;
    writeln!(
        w,
        "* **Client**: this benchmark, release build, Diesel 2.3 (libpq, libmariadb, bundled SQLite), r2d2 pool of {} connections, one thread per worker; the diesel-async cases: diesel-async 0.9 (tokio-postgres, mysql_async, bundled SQLite on tokio's blocking pool), bb8 pool of {} connections, one task per worker on a tokio runtime of {} threads.\n",
        crate::vocabulary::MAX_WORKERS,
        crate::vocabulary::MAX_WORKERS,
        crate::plan::ASYNC_THREADS
    )?;
    for s in &results.servers {
        writeln!(w, "**{}**: {}\n", report_name(s.backend), s.version.trim())?;
        writeln!(w, "| setting | value |")?;
        writeln!(w, "| --- | --- |")?;
        for (k, v) in &s.settings {
            writeln!(w, "| `{k}` | {v} |")?;
        }
        writeln!(w)?;
    }
    Ok(())
}
