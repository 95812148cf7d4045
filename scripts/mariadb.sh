#!/usr/bin/env bash
# A throwaway MariaDB server on loopback started with settings the shared server
# cannot take at run time, for lockkit's tests of them
# (tests/tests/rollback_on_timeout.rs):
#
#   --innodb-rollback-on-timeout   a lock wait timeout (1205) rolls back the whole
#                                  transaction, as a deadlock does.
#
#   scripts/mariadb.sh start   initialises a data directory, starts the server,
#                              creates the user `lockkit` (all privileges, no
#                              password, over TCP) and the database `test`, and
#                              prints `export ROLLBACK_ON_TIMEOUT_URL=url` on
#                              stdout (eval it); fails if the server does not start.
#   scripts/mariadb.sh stop    stops the server and removes its data.
#
# Port $ROLLBACK_ON_TIMEOUT_PORT (3321); data, log and pid file in
# $LOCKKIT_SERVER_DIR/mariadb-<port>. Needs mariadb-server (installed with
# apt-get when missing, as root). Run as root, the server drops to `mysql`.
set -euo pipefail

PORT="${ROLLBACK_ON_TIMEOUT_PORT:-3321}"
SERVER_DIR="${LOCKKIT_SERVER_DIR:-${TMPDIR:-/tmp}/lockkit-servers}"
DIR="$SERVER_DIR/mariadb-$PORT"

log() { printf '\033[1m[mariadb.sh]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
sql() { mariadb --no-defaults -uroot --socket="$DIR/mysqld.sock" -N -B -e "$1"; }
. "$(dirname "$0")/mariadb-common.sh"

stop_server() {
  mariadb_stop "$DIR/mysqld.pid"
  rm -rf "$DIR"
}

start_server() {
  mariadb_install_missing
  mariadb_prepare
  stop_server
  mkdir -p "$DIR"
  trap 'stop_server' EXIT # a server that did not start is not left behind
  log "starting MariaDB with --innodb-rollback-on-timeout on 127.0.0.1:$PORT ($DIR)"
  mariadb_init "$DIR" server
  # setsid: the server outlives this script; `stop` ends it through its pid file.
  setsid "$MARIADB_SERVER" --no-defaults "${MARIADB_USER_OPT[@]}" --datadir="$DIR/data" \
    --socket="$DIR/mysqld.sock" --pid-file="$DIR/mysqld.pid" --tmpdir="$DIR/tmp" \
    --port="$PORT" --bind-address=127.0.0.1 --max-connections=200 \
    --innodb-flush-log-at-trx-commit=2 --innodb-rollback-on-timeout=ON \
    </dev/null >"$DIR/server.log" 2>&1 &
  local deadline=$((SECONDS + 60))
  until sql "SELECT 1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 30 "$DIR/server.log" >&2; die "the server did not start"; }
    sleep 0.25
  done
  [ "$(sql "SELECT @@innodb_rollback_on_timeout")" = 1 ] \
    || die "the server runs without innodb_rollback_on_timeout"
  sql "$MARIADB_TEST_USER_SQL"
  trap - EXIT
  echo "export ROLLBACK_ON_TIMEOUT_URL=mysql://lockkit@127.0.0.1:$PORT/test"
}

case "${1:-}" in
  start) start_server ;;
  stop) stop_server ;;
  *) die "usage: $0 start|stop" ;;
esac
