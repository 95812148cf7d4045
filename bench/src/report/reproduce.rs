//! "Reproduce": the commands.

use std::fmt::{self, Write as _};

pub(super) fn section(w: &mut String) -> fmt::Result {
    writeln!(w, "## Reproduce\n")?;
    writeln!(
        w,
        "```sh\n\
         cargo run --release -p lockkit-bench                 # full run, ~9 minutes, writes docs/\n\
         cargo run --release -p lockkit-bench -- --quick      # one short repetition\n\
         cargo run --release -p lockkit-bench -- --help       # backends, --durable, --only, ...\n\
         # one side of the client-cost profile under callgrind:\n\
         valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=*measured_loop*' \\\n    \
         target/release/lockkit-bench --backends postgres --profile-only withlock-lockkit --ops 1000\n\
         ```\n\n\
         Servers: `PG_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), \
         `MYSQL_DATABASE_URL` (default `mysql://root@127.0.0.1:3306/test`); pgbench from the \
         `PATH`, `/usr/lib/postgresql/*/bin` or `PGBENCH`."
    )?;
    Ok(())
}
