# How lockkit's scripts run a throwaway PostgreSQL server: sourced by
# scripts/test.sh (the suite's server) and scripts/pg-standby.sh (the replica
# tests' primary and standby), which define `log` and `die`. Not run alone.

# pg_bin: the bin directory of the newest PostgreSQL installed under
# /usr/lib/postgresql (Debian's layout); empty when there is none.
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# pg_as_postgres: PostgreSQL refuses to run as root. Run as root, sets PG_RUN to
# the prefix that runs a server program as the user postgres (created when
# missing), who must then own the data directory; otherwise PG_RUN stays empty.
PG_RUN=()
pg_as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    PG_RUN=(runuser -u postgres --)
  fi
}

# pg_initdb BIN DATA LOG: a new cluster in DATA (superuser postgres, trust
# auth), initdb's output in LOG; fails the run, showing LOG, when initdb does.
pg_initdb() {
  "${PG_RUN[@]}" "$1/initdb" -D "$2" -U postgres --auth=trust >"$3" 2>&1 \
    || { cat "$3" >&2; die "initdb failed"; }
}

# pg_start BIN DATA LOG WHAT OPTIONS: starts the cluster in DATA with the server
# OPTIONS (`-p PORT -c ...`), its log in LOG, and waits until it accepts
# connections; fails the run, showing LOG, when WHAT does not start.
pg_start() {
  "${PG_RUN[@]}" "$1/pg_ctl" -D "$2" -l "$3" -w -o "$5" start >/dev/null \
    || { cat "$3" >&2; die "$4 did not start"; }
}
