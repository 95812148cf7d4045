#!/usr/bin/env bash
# A throwaway 3-node MariaDB Galera cluster on loopback, for lockkit's
# multi-primary tests (tests/tests/galera.rs) and the torture program.
#
#   scripts/galera.sh start   starts the cluster, waits for wsrep_cluster_size=3,
#                             creates the user `lockkit` (all privileges, no
#                             password, over TCP) and the database `test`, and
#                             prints `export GALERA_URLS=url1,url2,url3` on stdout
#                             (eval it); fails if the cluster does not form.
#   scripts/galera.sh stop    stops the nodes and removes their data.
#
# Ports: clients $GALERA_PORT..+2 (3311-3313); group communication
# $GALERA_GCOMM_PORT+0/10/20 (4567/4577/4587), IST at +1, rsync SST at +2.
# Data, logs and pid files in $LOCKKIT_SERVER_DIR/galera-$GALERA_PORT.
# A connection idle for 10 s is closed (--wait-timeout): MariaDB 10.11's Galera
# sometimes leaves a client waiting forever for the reply to a prepared statement
# it aborted for another node's write, and the client then sees a lost connection
# instead of hanging (tests/tests/galera.rs, `Cluster::node`).
# Needs mariadb-server, galera-4 and rsync (installed with apt-get when missing,
# as root). Run as root, the nodes drop to the `mysql` user: rsync SST fails
# with "Permission denied" when a node runs as root.
set -euo pipefail

GALERA_PORT="${GALERA_PORT:-3311}"
GALERA_GCOMM_PORT="${GALERA_GCOMM_PORT:-4567}"
SERVER_DIR="${LOCKKIT_SERVER_DIR:-${TMPDIR:-/tmp}/lockkit-servers}"
DIR="$SERVER_DIR/galera-$GALERA_PORT"
NODES=(1 2 3)

log() { printf '\033[1m[galera.sh]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

client_port() { echo $((GALERA_PORT + $1 - 1)); }
gcomm_port() { echo $((GALERA_GCOMM_PORT + 10 * ($1 - 1))); }
node_dir() { echo "$DIR/node$1"; }
sql() { # sql NODE STATEMENT: as root over the node's socket
  mariadb --no-defaults -uroot --socket="$(node_dir "$1")/mysqld.sock" -N -B -e "$2"
}

stop_cluster() {
  local n pid pids=()
  for n in "${NODES[@]}"; do
    pid="$(cat "$(node_dir "$n")/mysqld.pid" 2>/dev/null || true)"
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$DIR"
}

install_missing() {
  local missing=()
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  [ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
  command -v rsync >/dev/null || missing+=(rsync)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
    || die "missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
  log "installing ${missing[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

start_node() { # start_node N [--wsrep-new-cluster]
  local n="$1" dir cluster="" p
  shift
  dir="$(node_dir "$n")"
  for p in "${NODES[@]}"; do cluster+="${cluster:+,}127.0.0.1:$(gcomm_port "$p")"; done
  [ "${1:-}" = "--wsrep-new-cluster" ] && cluster=""
  # setsid: the node outlives this script; `stop` ends it through its pid file.
  setsid "$SERVER" --no-defaults "${USER_OPT[@]}" --datadir="$dir/data" \
    --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --tmpdir="$dir/tmp" \
    --port="$(client_port "$n")" --bind-address=127.0.0.1 --max-connections=300 \
    --innodb-flush-log-at-trx-commit=2 --binlog-format=ROW --innodb-autoinc-lock-mode=2 \
    --default-storage-engine=InnoDB --wait-timeout=10 --wsrep-on=ON \
    --wsrep-provider=/usr/lib/galera/libgalera_smm.so \
    --wsrep-cluster-name="lockkit-$GALERA_PORT" --wsrep-cluster-address="gcomm://$cluster" \
    --wsrep-node-name="node$n" --wsrep-node-address="127.0.0.1:$(gcomm_port "$n")" \
    --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$(($(gcomm_port "$n") + 1))" \
    --wsrep-sst-receive-address="127.0.0.1:$(($(gcomm_port "$n") + 2))" \
    --wsrep-sst-method=rsync "$@" </dev/null >"$dir/server.log" 2>&1 &
}

wait_for() { # wait_for SECONDS COMMAND...: until the command succeeds
  local deadline=$((SECONDS + $1))
  shift
  until "$@" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.25
  done
}
synced() { [ "$(sql "$1" "SHOW STATUS LIKE 'wsrep_local_state_comment'" | cut -f2)" = Synced ]; }
size_is_3() { [ "$(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)" = 3 ]; }

start_cluster() {
  install_missing
  SERVER="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
  USER_OPT=()
  stop_cluster
  mkdir -p "$DIR"
  trap 'stop_cluster' EXIT # a cluster that did not form is not left behind
  if [ "$(id -u)" -eq 0 ]; then
    id mysql >/dev/null 2>&1 || useradd --system --no-create-home mysql
    USER_OPT=(--user=mysql)
  fi
  log "starting a 3-node Galera cluster on 127.0.0.1:$(client_port 1)-$(client_port 3) ($DIR)"
  local n started=$SECONDS
  for n in "${NODES[@]}"; do
    # Each node and its bootstrap with a tmpdir of its own: a mariadbd that
    # starts deletes the `#sql*` files in its tmpdir, and in a shared /tmp
    # those can be another bootstrap's (scripts/mariadb.sh starts alongside),
    # which then fails ("Could not remove temporary table").
    mkdir -p "$(node_dir "$n")/tmp"
    [ "$(id -u)" -eq 0 ] && chown mysql "$(node_dir "$n")/tmp"
    mariadb-install-db --no-defaults "${USER_OPT[@]}" --datadir="$(node_dir "$n")/data" \
      --tmpdir="$(node_dir "$n")/tmp" >"$(node_dir "$n")/install.log" 2>&1 \
      || { cat "$(node_dir "$n")/install.log" >&2; die "mariadb-install-db failed (node $n)"; }
  done
  [ "$(id -u)" -eq 0 ] && chown -R mysql "$DIR"
  start_node 1 --wsrep-new-cluster
  wait_for 60 synced 1 || { tail -n 30 "$(node_dir 1)/server.log" >&2; die "node 1 did not bootstrap"; }
  sql 1 "CREATE USER lockkit@'%'; GRANT ALL ON *.* TO lockkit@'%' WITH GRANT OPTION;
         CREATE USER lockkit@localhost; GRANT ALL ON *.* TO lockkit@localhost WITH GRANT OPTION;
         CREATE DATABASE IF NOT EXISTS test"
  start_node 2
  start_node 3
  wait_for 120 size_is_3 && wait_for 60 synced 2 && wait_for 60 synced 3 || {
    for n in "${NODES[@]}"; do log "node $n:"; tail -n 20 "$(node_dir "$n")/server.log" >&2; done
    die "the cluster did not reach wsrep_cluster_size=3"
  }
  log "cluster size 3 in $((SECONDS - started)) s"
  local urls=""
  for n in "${NODES[@]}"; do urls+="${urls:+,}mysql://lockkit@127.0.0.1:$(client_port "$n")/test"; done
  trap - EXIT
  echo "export GALERA_URLS=$urls"
}

case "${1:-}" in
  start) start_cluster ;;
  stop) stop_cluster ;;
  *) die "usage: $0 start|stop" ;;
esac
