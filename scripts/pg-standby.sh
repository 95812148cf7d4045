#!/usr/bin/env bash
# A throwaway PostgreSQL primary and a streaming standby of it, for lockkit's
# replica tests (tests/tests/replica.rs). scripts/test.sh calls it; run it alone
# while working on the replica module:
#
#   scripts/pg-standby.sh start DIR [PRIMARY_PORT] [STANDBY_PORT]   # 5441, 5442
#   export PG_PRIMARY_URL=postgres://postgres@127.0.0.1:5441/test
#   export PG_STANDBY_URL=postgres://postgres@127.0.0.1:5442/test
#   scripts/pg-standby.sh stop DIR
#
# `promote DIR` promotes the standby (a test's own pair: a server that was a
# standby and is one no longer).
#
# `start` runs initdb (trust auth), starts the primary, creates database `test`,
# copies it with `pg_basebackup -R -X stream -c fast` (`-R` writes the standby's
# `primary_conninfo` and `standby.signal`; `-c fast` checkpoints at once instead of
# spreading the checkpoint over minutes), starts the standby on its own port and
# waits until the primary reports it `streaming`. Both listen on 127.0.0.1 only
# and run as the `postgres` user when started as root (PostgreSQL refuses root).
# Everything lives in DIR, which `start` empties first. A port already in use is
# an error: this script never touches a server it did not start.
set -euo pipefail

log() { printf '\033[1m[pg-standby]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
. "$(dirname "$0")/postgres.sh"

command="${1:-}"
dir="${2:-}"
[ -n "$command" ] && [ -n "$dir" ] || die "usage: $0 start|stop|promote DIR [PRIMARY_PORT] [STANDBY_PORT]"
primary_port="${3:-5441}"
standby_port="${4:-5442}"

bin="$(pg_bin)"
[ -n "$bin" ] && [ -x "$bin/initdb" ] && [ -x "$bin/pg_basebackup" ] \
  || die "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin; run: apt-get install -y postgresql"

pg_as_postgres

stop() {
  local data
  for data in "$dir/standby" "$dir/primary"; do
    if [ -f "$data/postmaster.pid" ]; then
      "${PG_RUN[@]}" "$bin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
  done
}

case "$command" in
  stop)
    stop
    exit 0
    ;;
  promote)
    "${PG_RUN[@]}" "$bin/pg_ctl" -D "$dir/standby" -w promote >/dev/null
    exit 0
    ;;
  start) ;;
  *) die "unknown command $command (start, stop or promote)" ;;
esac

stop # a previous run's servers in the same DIR (a run that was killed)
for port in "$primary_port" "$standby_port"; do
  if listening "$port"; then
    die "127.0.0.1:$port is in use; pick other ports (PG_PRIMARY_PORT, PG_STANDBY_PORT) or set PG_PRIMARY_URL and PG_STANDBY_URL"
  fi
done
rm -rf "$dir" && mkdir -p "$dir"
[ ${#PG_RUN[@]} -eq 0 ] || chown postgres "$dir"
# Sockets in DIR, never in /var/run/postgresql, which the system server owns.
options="-k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"

started=$(date +%s%3N)
log "primary on 127.0.0.1:$primary_port, standby on 127.0.0.1:$standby_port ($dir)"
pg_initdb "$bin" "$dir/primary" "$dir/initdb.log"
# wal_level=replica and max_wal_senders are PostgreSQL's defaults since 10; set
# anyway so that a changed default cannot break the copy.
pg_start "$bin" "$dir/primary" "$dir/primary.log" "the primary" \
  "-p $primary_port $options -c wal_level=replica -c max_wal_senders=4"
"${PG_RUN[@]}" "$bin/createdb" -h 127.0.0.1 -p "$primary_port" -U postgres test

"${PG_RUN[@]}" "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
  -D "$dir/standby" -R -X stream -c fast >"$dir/basebackup.log" 2>&1 \
  || { cat "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
# The copied postgresql.conf names no port (the command line sets it), so the
# standby's own comes from the command line too. hot_standby_feedback keeps the
# primary's vacuum from cancelling the tests' reads on the standby.
pg_start "$bin" "$dir/standby" "$dir/standby.log" "the standby" \
  "-p $standby_port $options -c hot_standby=on -c hot_standby_feedback=on"

psql() { "${PG_RUN[@]}" "$bin/psql" -X -qAt -h 127.0.0.1 -U postgres -d test "$@"; }
for _ in $(seq 1 100); do
  state="$(psql -p "$primary_port" -c "SELECT state FROM pg_stat_replication" 2>/dev/null || true)"
  if [ "$state" = "streaming" ]; then
    [ "$(psql -p "$standby_port" -c "SELECT pg_is_in_recovery()")" = "t" ] \
      || die "the server on $standby_port is not in recovery"
    log "standby streaming after $(($(date +%s%3N) - started)) ms"
    exit 0
  fi
  sleep 0.1
done
cat "$dir/standby.log" >&2
die "the standby did not reach state streaming in 10 s"
