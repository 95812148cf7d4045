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
. "$(dirname "$0")/mariadb-common.sh"

stop_cluster() {
  local n files=()
  for n in "${NODES[@]}"; do files+=("$(node_dir "$n")/mysqld.pid"); done
  mariadb_stop "${files[@]}"
  rm -rf "$DIR"
}

install_missing() {
  local missing=()
  [ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
  command -v rsync >/dev/null || missing+=(rsync)
  mariadb_install_missing "${missing[@]}"
}

start_node() { # start_node N [--wsrep-new-cluster]
  local n="$1" dir cluster="" p
  shift
  dir="$(node_dir "$n")"
  for p in "${NODES[@]}"; do cluster+="${cluster:+,}127.0.0.1:$(gcomm_port "$p")"; done
  [ "${1:-}" = "--wsrep-new-cluster" ] && cluster=""
  # setsid: the node outlives this script; `stop` ends it through its pid file.
  setsid "$MARIADB_SERVER" --no-defaults "${MARIADB_USER_OPT[@]}" --datadir="$dir/data" \
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
  mariadb_prepare
  stop_cluster
  mkdir -p "$DIR"
  trap 'stop_cluster' EXIT # a cluster that did not form is not left behind
  log "starting a 3-node Galera cluster on 127.0.0.1:$(client_port 1)-$(client_port 3) ($DIR)"
  local n started=$SECONDS
  for n in "${NODES[@]}"; do mariadb_init "$(node_dir "$n")" "node $n"; done
  start_node 1 --wsrep-new-cluster
  wait_for 60 synced 1 || { tail -n 30 "$(node_dir 1)/server.log" >&2; die "node 1 did not bootstrap"; }
  sql 1 "$MARIADB_TEST_USER_SQL"
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
