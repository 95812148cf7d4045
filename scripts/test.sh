#!/usr/bin/env bash
# lockkit's test command: formatting, lints, the first-contact, feature, doc and
# packaging checks, and the whole test suite on real PostgreSQL, MySQL/MariaDB,
# SQLite and Redis (CONTRIBUTING.md lists the steps).
#
# Servers (NATS with JetStream, for examples/outbox, likewise; a 3-node Galera
# cluster comes from scripts/galera.sh unless GALERA_URLS is set, a MariaDB with
# --innodb-rollback-on-timeout from scripts/mariadb.sh unless
# ROLLBACK_ON_TIMEOUT_URL is set), in this order:
#   1. PG_DATABASE_URL / MYSQL_DATABASE_URL / REDIS_URL when set;
#   2. a server already listening on 127.0.0.1:$PG_PORT (5432) / :$MYSQL_PORT (3306) /
#      :$REDIS_PORT (6379), used as postgres://postgres@127.0.0.1:PORT/test,
#      mysql://root@127.0.0.1:PORT/test and redis://127.0.0.1:PORT/;
#   3. a throwaway server started from the installed binaries (trust auth, data in
#      $LOCKKIT_SERVER_DIR, stopped when this script ends; Redis keeps nothing on disk);
#   4. the binaries installed with apt-get (Debian/Ubuntu, as root), then 3.
# The suite shares a Redis with whatever else uses it: each test keeps to its own
# key prefix (no FLUSHALL).
# The replica tests get a PostgreSQL primary and a streaming standby of their own
# (scripts/pg-standby.sh; or PG_PRIMARY_URL and PG_STANDBY_URL), see below.
# A backend that cannot be reached fails the run: nothing is skipped.
# SQLite is compiled in (bundled); the PostgreSQL and MySQL client libraries
# (libpq, libmariadb) are installed with apt-get when missing.
set -euo pipefail

cd "$(dirname "$0")/.."
PG_PORT="${PG_PORT:-5432}"
MYSQL_PORT="${MYSQL_PORT:-3306}"
REDIS_PORT="${REDIS_PORT:-6379}"
SERVER_DIR="${LOCKKIT_SERVER_DIR:-${TMPDIR:-/tmp}/lockkit-servers}"
CLEANUP=()

log() { printf '\033[1m[test.sh]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for_port() {
  for _ in $(seq 1 60); do listening "$1" && return 0; sleep 0.5; done
  return 1
}
cleanup() {
  local i
  for ((i = ${#CLEANUP[@]} - 1; i >= 0; i--)); do eval "${CLEANUP[i]}" || true; done
}
trap cleanup EXIT

APT_UPDATED=0
apt_install() {
  if ! command -v apt-get >/dev/null; then
    die "missing $*; install them with your package manager (Debian: apt-get install $*)"
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "missing $*; run: sudo apt-get install -y $*"
    sudo="sudo"
  fi
  log "installing $* with apt-get"
  if [ "$APT_UPDATED" -eq 0 ]; then
    $sudo apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# server_binary VAR PACKAGE NAME...: sets VAR to the path of the first program
# NAME that is installed (on PATH, else in /usr/sbin or /usr/bin); when none is,
# installs PACKAGE with apt-get and looks again.
server_binary() {
  local var=$1 package=$2 attempt name path
  shift 2
  for attempt in installed apt-get; do
    for name in "$@"; do
      path="$(command -v "$name" || ls "/usr/sbin/$name" "/usr/bin/$name" 2>/dev/null | head -n 1 || true)"
      [ -z "$path" ] || { printf -v "$var" '%s' "$path"; return 0; }
    done
    [ "$attempt" = apt-get ] || apt_install "$package"
  done
  die "no $* binary after installing $package"
}

# server_dir VAR NAME PORT WHAT: sets VAR to $SERVER_DIR/NAME-PORT, emptied, for
# the throwaway WHAT about to start on 127.0.0.1:PORT, and says so.
server_dir() {
  local var=$1 path="$SERVER_DIR/$2-$3"
  rm -rf "$path" && mkdir -p "$path"
  log "starting a throwaway $4 on 127.0.0.1:$3 ($path)"
  printf -v "$var" '%s' "$path"
}

# background_server NAME PORT LOG COMMAND...: runs COMMAND in the background,
# its output in LOG, killed when this script ends; fails the run, showing LOG,
# when nothing listens on 127.0.0.1:PORT within 30 s.
background_server() {
  local name=$1 port=$2 output=$3
  shift 3
  "$@" >"$output" 2>&1 &
  CLEANUP+=("kill $! 2>/dev/null; wait $! 2>/dev/null")
  wait_for_port "$port" || { cat "$output" >&2; die "$name did not start"; }
}

# --- toolchain and client libraries ----------------------------------------
command -v cargo >/dev/null || die "cargo not found; install Rust from https://rustup.rs"
missing=()
command -v cc >/dev/null || missing+=(gcc)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v pg_config >/dev/null || pkg-config --exists libpq 2>/dev/null || missing+=(libpq-dev)
command -v mysql_config >/dev/null || command -v mariadb_config >/dev/null \
  || pkg-config --exists mysqlclient libmariadb 2>/dev/null || missing+=(libmariadb-dev-compat libmariadb-dev)
# examples/edit_form's browser test drives headless Chromium through chromedriver.
command -v chromedriver >/dev/null && { command -v chromium >/dev/null || [ -n "${CHROMIUM:-}" ]; } \
  || missing+=(chromium chromium-driver)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

# use_server VAR NAME PORT START URL: VAR when it is set; else the server on
# 127.0.0.1:PORT, started by the function START when nothing listens there; a
# server that does not answer fails the run. Exports VAR=URL and says which.
use_server() {
  local var=$1 name=$2 port=$3 start=$4 url=$5
  if [ -z "${!var:-}" ]; then
    if ! listening "$port"; then
      "$start"
    fi
    wait_for_port "$port" || die "$name is not reachable on 127.0.0.1:$port"
    export "$var=$url"
  fi
  log "$name: ${!var}"
}

# --- PostgreSQL --------------------------------------------------------------
. scripts/postgres.sh # pg_bin, pg_as_postgres, pg_initdb, pg_start
start_throwaway_pg() {
  local bin dir
  bin="$(pg_bin)"
  if [ -z "$bin" ]; then
    apt_install postgresql
    bin="$(pg_bin)"
  fi
  [ -x "$bin/initdb" ] || die "no PostgreSQL binaries; run: apt-get install -y postgresql"
  server_dir dir postgres "$PG_PORT" PostgreSQL
  pg_as_postgres
  [ ${#PG_RUN[@]} -eq 0 ] || chown -R postgres "$dir"
  pg_initdb "$bin" "$dir/data" "$dir/initdb.log"
  pg_start "$bin" "$dir/data" "$dir/server.log" PostgreSQL \
    "-p $PG_PORT -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
  CLEANUP+=("${PG_RUN[*]} '$bin/pg_ctl' -D '$dir/data' -m immediate stop >/dev/null 2>&1")
  "${PG_RUN[@]}" "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres test
}
use_server PG_DATABASE_URL "PostgreSQL" "$PG_PORT" start_throwaway_pg "postgres://postgres@127.0.0.1:$PG_PORT/test"

# --- MySQL / MariaDB -----------------------------------------------------------
start_throwaway_mysql() {
  local server dir
  server_binary server mariadb-server mariadbd mysqld
  command -v mariadb-install-db >/dev/null || die "no mariadb-install-db; run: apt-get install -y mariadb-server"
  server_dir dir mysql "$MYSQL_PORT" MariaDB
  local user=()
  if [ "$(id -u)" -eq 0 ]; then user=(--user=root); fi
  mariadb-install-db --no-defaults "${user[@]}" --datadir="$dir/data" \
    --auth-root-authentication-method=normal >"$dir/install.log" 2>&1 \
    || { cat "$dir/install.log" >&2; die "mariadb-install-db failed"; }
  background_server MariaDB "$MYSQL_PORT" "$dir/server.log" \
    "$server" --no-defaults "${user[@]}" --datadir="$dir/data" --socket="$dir/mysqld.sock" \
    --port="$MYSQL_PORT" --bind-address=127.0.0.1 --pid-file="$dir/mysqld.pid" \
    --innodb-flush-log-at-trx-commit=2 --max-connections=300
  for _ in $(seq 1 20); do
    mariadb --no-defaults -uroot -h127.0.0.1 -P"$MYSQL_PORT" -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null && return 0
    sleep 0.5
  done
  die "could not create database test on the throwaway MariaDB"
}
use_server MYSQL_DATABASE_URL "MySQL/MariaDB" "$MYSQL_PORT" start_throwaway_mysql "mysql://root@127.0.0.1:$MYSQL_PORT/test"

# --- Redis (the lease store's tests) --------------------------------------------
start_throwaway_redis() {
  local server dir
  server_binary server redis-server redis-server
  server_dir dir redis "$REDIS_PORT" Redis
  background_server Redis "$REDIS_PORT" "$dir/server.log" \
    "$server" --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
    --daemonize no
}
use_server REDIS_URL "Redis" "$REDIS_PORT" start_throwaway_redis "redis://127.0.0.1:$REDIS_PORT/"

# --- NATS with JetStream (the broker of examples/outbox) ---------------------
# NATS_URL when set; else a server on 127.0.0.1:$NATS_PORT (4222), which must have
# JetStream on (the outbox tests fail, saying so, if not); else a throwaway server
# from the installed nats-server; else nats-server installed with apt-get.
NATS_PORT="${NATS_PORT:-4222}"
start_throwaway_nats() {
  local server dir
  server_binary server nats-server nats-server
  server_dir dir nats "$NATS_PORT" "NATS server with JetStream"
  background_server NATS "$NATS_PORT" "$dir/server.log" \
    "$server" -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$dir/jetstream"
}
use_server NATS_URL "NATS" "$NATS_PORT" start_throwaway_nats "nats://127.0.0.1:$NATS_PORT"

# --- PostgreSQL primary and streaming standby (the replica tests) ---------------
# PG_PRIMARY_URL and PG_STANDBY_URL when both are set (a primary and a hot standby
# streaming from it; the tests pause and resume its replay); else a throwaway pair
# from scripts/pg-standby.sh on 127.0.0.1:$PG_PRIMARY_PORT (5441) and
# :$PG_STANDBY_PORT (5442), stopped when this script ends. Never the server of
# PG_DATABASE_URL: its configuration is not ours to change.
if [ -z "${PG_PRIMARY_URL:-}" ] || [ -z "${PG_STANDBY_URL:-}" ]; then
  PG_PRIMARY_PORT="${PG_PRIMARY_PORT:-5441}"
  PG_STANDBY_PORT="${PG_STANDBY_PORT:-5442}"
  replicas_dir="$SERVER_DIR/postgres-replicas-$PG_PRIMARY_PORT"
  CLEANUP+=("scripts/pg-standby.sh stop '$replicas_dir'")
  scripts/pg-standby.sh start "$replicas_dir" "$PG_PRIMARY_PORT" "$PG_STANDBY_PORT" \
    || die "could not start a PostgreSQL primary and standby (scripts/pg-standby.sh)"
  export PG_PRIMARY_URL="postgres://postgres@127.0.0.1:$PG_PRIMARY_PORT/test"
  export PG_STANDBY_URL="postgres://postgres@127.0.0.1:$PG_STANDBY_PORT/test"
fi
log "PostgreSQL primary: $PG_PRIMARY_URL, standby: $PG_STANDBY_URL"
# --- a 3-node MariaDB Galera cluster (tests/tests/galera.rs) -------------------
# GALERA_URLS (comma-separated, one URL a node) when set; else a throwaway cluster
# from scripts/galera.sh, formed (about 15 s) while the checks below build, and
# stopped when this script ends. A cluster that does not form fails the run.
GALERA_START=""
if [ -z "${GALERA_URLS:-}" ]; then
  mkdir -p "$SERVER_DIR"
  scripts/galera.sh start >"$SERVER_DIR/galera.env" &
  GALERA_START=$!
  CLEANUP+=("scripts/galera.sh stop")
  CLEANUP+=('[ -z "$GALERA_START" ] || { kill "$GALERA_START"; wait "$GALERA_START"; } 2>/dev/null')
fi

# --- MariaDB with --innodb-rollback-on-timeout (tests/tests/rollback_on_timeout.rs)
# ROLLBACK_ON_TIMEOUT_URL when set; else a throwaway server from scripts/mariadb.sh
# (about 1 s), stopped when this script ends. A server that does not start fails
# the run.
if [ -z "${ROLLBACK_ON_TIMEOUT_URL:-}" ]; then
  mkdir -p "$SERVER_DIR"
  CLEANUP+=("scripts/mariadb.sh stop")
  scripts/mariadb.sh start >"$SERVER_DIR/mariadb.env" \
    || die "could not start MariaDB with --innodb-rollback-on-timeout (scripts/mariadb.sh)"
  . "$SERVER_DIR/mariadb.env"
fi
log "MariaDB with innodb_rollback_on_timeout: $ROLLBACK_ON_TIMEOUT_URL"

# --- the suite ---------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

# `cargo run -p shop` must work with Rust alone: with default features no example
# may link a database client library, even on this machine, which has them.
log "examples: default features need no database client library"
# (The whole tree, searched by name: `cargo tree -i pq-sys` fails outright for an
# example that could never reach it, such as edit_form.)
for example in shop job_queue http_api outbox edit_form; do
  tree="$(cargo tree --locked -p "$example" -e normal --prefix none)" \
    || die "cargo tree -p $example failed"
  for sys in pq-sys mysqlclient-sys; do
    if printf '%s\n' "$tree" | grep -q "^$sys v"; then
      cargo tree --locked -p "$example" -e normal -i "$sys" >&2 || true
      die "$example's default features depend on $sys"
    fi
  done
done
# Users pay only for the features they pick: each of lockkit's features builds
# alone and in the usual combinations, and the examples build with their defaults.
# A loop over `cargo clippy` (dependencies are shared with the run below) rather
# than cargo-hack, which would have to be compiled first.
log "lockkit: each feature alone and the usual combinations"
for features in "" derive postgres mysql sqlite r2d2 idempotency idempotency-migrations bound-etags \
  metrics serde axum postgres,r2d2 mysql,r2d2 sqlite,r2d2 postgres,idempotency \
  sqlite,idempotency-migrations postgres,axum,metrics uuid postgres,uuid \
  lease lease-migrations redis postgres,lease mysql,lease-migrations sqlite,redis outbox \
  outbox-migrations sqlite,outbox postgres,outbox-migrations mysql,outbox,r2d2 \
  replica replica,r2d2 replica,async \
  async postgres,async mysql,async sqlite,async derive,postgres,mysql,sqlite,async; do
  cargo clippy --locked -q -p lockkit --no-default-features --features "$features" --all-targets \
    -- -D warnings || die "lockkit does not build with features [$features]"
done
# --all-targets builds lockkit's tests too, whose dev-dependency on lockkit
# turns on `sqlite` and `async`: the library alone, without them.
log "lockkit: the library alone, without SQLite"
for features in "" r2d2 postgres mysql postgres,r2d2 mysql,r2d2; do
  cargo clippy --locked -q -p lockkit --lib --no-default-features --features "$features" \
    -- -D warnings || die "lockkit's library does not build with features [$features]"
done
log "lockkit: doc examples with default features"
cargo test --locked -q -p lockkit --doc
log "examples: default features"
cargo clippy --locked -q -p shop -p job_queue -p http_api -p outbox -p edit_form --all-targets -- -D warnings
log "cargo doc (published crates, all features, warnings are errors)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --locked -q --no-deps --all-features \
  -p lockkit -p lockkit-derive
log "cargo package (lockkit-derive, then lockkit, verified together)"
cargo package --locked -q --allow-dirty -p lockkit-derive -p lockkit
log "cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
if [ -n "$GALERA_START" ]; then
  wait "$GALERA_START" || { GALERA_START=""; die "the Galera cluster did not form (scripts/galera.sh start)"; }
  GALERA_START=""
  . "$SERVER_DIR/galera.env"
fi
log "Galera: $GALERA_URLS"
log "cargo test (PostgreSQL, MySQL/MariaDB, SQLite, Galera, rollback on timeout)"
cargo test --workspace --all-features --locked "$@"
