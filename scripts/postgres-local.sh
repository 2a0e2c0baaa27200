#!/usr/bin/env bash
# A throwaway PostgreSQL server on this machine, for hcp-tune's PostgreSQL tests and
# benchmark (a team's ledger: search.storage=postgresql://...), and for trying one out.
#
#   scripts/postgres-local.sh start    install Debian's postgresql if missing, create a fresh
#                                      data directory, start the server (a Unix socket, and
#                                      127.0.0.1 for the password tests), create role and db
#   scripts/postgres-local.sh stop     stop the server this script started, delete its data
#   scripts/postgres-local.sh restart  restart it (a fast shutdown: every session is cut)
#   scripts/postgres-local.sh halt     stop it but keep its data (start brings it back)
#   scripts/postgres-local.sh status   say whether it runs
#   scripts/postgres-local.sh url      print the URL of its database (over the socket)
#
# The server runs as the `postgres` system user that Debian's package creates (PostgreSQL
# refuses to run as root); run by a user other than root, it runs as that user and needs
# the package installed. Local socket connections are trusted; TCP ones need the role's
# password (scram-sha-256), so a wrong password can be tested. Idempotent: `start` on a
# running server only checks that it answers.
set -euo pipefail

DIR="${HCP_TUNE_PG_DIR:-/tmp/hcp-tune-pg}"     # data/, run/ (the socket), server.log
PORT="${HCP_TUNE_PG_PORT:-55432}"
ROLE=hcp
PASSWORD=hcp-local                              # TCP only; the socket is trusted
DB=hcp
WAIT_S="${HCP_TUNE_PG_WAIT_S:-60}"

log() { echo "postgres-local: $*"; }
die() { echo "postgres-local: error: $*" >&2; exit 1; }

bindir() {  # the newest installed server's bin/ (Debian: /usr/lib/postgresql/<major>/bin)
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
    [[ -n $d && -x $d/initdb && -x $d/pg_ctl ]] && echo "$d"
}

install_packages() {
    bindir >/dev/null && return
    [[ $(id -u) -eq 0 ]] || die "PostgreSQL is not installed (apt-get install postgresql, as root)"
    log "installing postgresql from Debian packages (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q -o DPkg::Lock::Timeout=600 >/dev/null
    apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends postgresql >/dev/null
    bindir >/dev/null || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
}

as_owner() {  # run a command as the server's user
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() { [[ -f $DIR/data/postmaster.pid ]] && as_owner "$(bindir)/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; }

sql() { as_owner "$(bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR/run" -p "$PORT" -U postgres -d postgres "$@"; }

start() {
    install_packages
    local bin; bin=$(bindir)
    if running; then
        log "already running (socket $DIR/run, port $PORT)"
        return
    fi
    if [[ -f $DIR/data/PG_VERSION && -f $DIR/ready ]]; then  # halted: start it again, data kept
        launch
        return
    fi
    rm -rf "$DIR"
    mkdir -p "$DIR/data" "$DIR/run"
    [[ $(id -u) -eq 0 ]] && chown -R postgres: "$DIR"
    chmod 0700 "$DIR/data"
    log "initdb in $DIR/data"
    as_owner "$bin/initdb" -D "$DIR/data" -U postgres --auth-local=trust \
        --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    launch
    sql -c "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'" \
        -c "CREATE DATABASE $DB OWNER $ROLE" >/dev/null
    touch "$DIR/ready"
    log "up: $(url)"
}

launch() {
    log "starting the server (socket $DIR/run, 127.0.0.1:$PORT)"
    as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t "$WAIT_S" start \
        -o "-p $PORT -k $DIR/run -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" \
        >/dev/null || { tail -n 20 "$DIR/server.log" >&2; die "the server did not start"; }
}

halt() {  # stop the server, keep its data (start brings it back): an outage, for tests
    running || die "not running"
    as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
    log "halted (data kept; start resumes it)"
}

stop() {
    if running; then
        as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
        log "stopped"
    else
        log "not running"
    fi
    rm -rf "$DIR"
}

restart() {  # a fast restart (its sessions are cut): how the tests drop a sweep's connection
    running || die "not running"
    as_owner "$(bindir)/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -m fast -w restart >/dev/null
    log "restarted"
}

status() {
    if running; then log "running: $(url)"; else log "not running"; return 1; fi
}

url() { echo "postgresql://$ROLE@/$DB?host=$DIR/run&port=$PORT"; }

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    restart) restart ;;
    halt) halt ;;
    status) status ;;
    url) url ;;
    *) echo "usage: $0 start|stop|restart|halt|status|url" >&2; exit 2 ;;
esac
