# How lockkit's scripts run throwaway MariaDB servers: sourced by
# scripts/mariadb.sh (one server with settings the shared one cannot take) and
# scripts/galera.sh (a 3-node cluster), which define `log` and `die`. Not run
# alone.

# mariadb_install_missing [PACKAGE...]: installs mariadb-server when mariadbd is
# missing, and the PACKAGEs given (the caller's own checks found them missing),
# with apt-get as root; otherwise fails the run saying what to install.
mariadb_install_missing() {
  local missing=("$@")
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing=(mariadb-server "${missing[@]}")
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
    || die "missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
  log "installing ${missing[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# mariadb_prepare: sets MARIADB_SERVER to the mariadbd to run and, run as root,
# MARIADB_USER_OPT to `--user=mysql` (the user created when missing): the
# server, and Galera's rsync SST, refuse to run as root. Empty otherwise.
MARIADB_USER_OPT=()
mariadb_prepare() {
  MARIADB_SERVER="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
  if [ "$(id -u)" -eq 0 ]; then
    id mysql >/dev/null 2>&1 || useradd --system --no-create-home mysql
    MARIADB_USER_OPT=(--user=mysql)
  fi
}

# mariadb_init DIR WHAT: a new data directory in DIR/data with a tmpdir of its
# own in DIR/tmp (a mariadbd that starts deletes the `#sql*` files in its
# tmpdir, and in a shared /tmp those can be another bootstrap's: the Galera
# nodes and scripts/mariadb.sh start alongside, and the bootstrap then fails
# with "Could not remove temporary table"); fails the run, showing the
# bootstrap's log, when WHAT's bootstrap does. Call mariadb_prepare first.
mariadb_init() {
  mkdir -p "$1/tmp"
  [ "$(id -u)" -eq 0 ] && chown mysql "$1/tmp"
  mariadb-install-db --no-defaults "${MARIADB_USER_OPT[@]}" --datadir="$1/data" \
    --tmpdir="$1/tmp" >"$1/install.log" 2>&1 \
    || { cat "$1/install.log" >&2; die "mariadb-install-db failed ($2)"; }
  [ "$(id -u)" -eq 0 ] && chown -R mysql "$1"
  return 0
}

# mariadb_stop PIDFILE...: ends the servers whose pid files these are, each
# given 15 s to shut down before it is killed.
mariadb_stop() {
  local file pid pids=()
  for file in "$@"; do
    pid="$(cat "$file" 2>/dev/null || true)"
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

# What a started server runs as root for the tests: the user `lockkit` (all
# privileges, no password, over TCP and the socket) and the database `test`.
MARIADB_TEST_USER_SQL="CREATE USER lockkit@'%'; GRANT ALL ON *.* TO lockkit@'%' WITH GRANT OPTION;
  CREATE USER lockkit@localhost; GRANT ALL ON *.* TO lockkit@localhost WITH GRANT OPTION;
  CREATE DATABASE IF NOT EXISTS test"
