#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for trying the gateway on PostgreSQL
# (README "Two replicas and two peers on one machine", docs/scale-out.md):
#
#   scripts/pg-throwaway.sh DIR [PORT]   initdb in DIR/data, start the server on
#                                        127.0.0.1:PORT (default 55432), create the
#                                        database "pipestream" and print its URL
#   scripts/pg-throwaway.sh --stop DIR   stop it (DIR stays; remove it yourself)
#
# The same cluster internal/pgtest starts for the tests: trust authentication
# on loopback only, the unix socket in DIR, user postgres. Run as root, the
# server runs as the postgres user (runuser), so DIR must be reachable by it.
# PG_THROWAWAY_OPTS adds server options (the e2e tests: -c fsync=off ...).
# Needs the server binaries: apt-get update && apt-get install -y postgresql
set -euo pipefail

die() { echo "pg-throwaway: $*" >&2; exit 1; }

bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return; }
  die "initdb and pg_ctl not found in /usr/lib/postgresql/*/bin or \$PATH; install them with: apt-get update && apt-get install -y postgresql"
}

# as runs a server binary, as the postgres user when we are root.
as() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

[ $# -ge 1 ] || die "usage: $0 DIR [PORT] | $0 --stop DIR"
BIN="$(bindir)"

if [ "$1" = --stop ]; then
  [ $# = 2 ] || die "usage: $0 --stop DIR"
  as "$BIN/pg_ctl" -D "$2/data" -m fast -w stop >/dev/null
  exit 0
fi

DIR="$1" PORT="${2:-55432}"
[ ! -e "$DIR/data" ] || die "$DIR/data exists: stop and remove that cluster first"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || die "as root the server runs as the postgres user, which does not exist (apt-get install -y postgresql creates it)"
  chown postgres: "$DIR"
  runuser -u postgres -- test -x "$DIR" || die "the postgres user cannot reach $DIR: make its parent directories searchable (chmod o+x) or use a directory under /tmp"
fi
as "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 ||
  die "initdb failed: $(tail -5 "$DIR/initdb.log")"
as "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t 60 \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 ${PG_THROWAWAY_OPTS:-}" start >/dev/null ||
  die "pg_ctl start on port $PORT failed: $(tail -5 "$DIR/postgres.log")"
as "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres pipestream
echo "postgres://postgres@127.0.0.1:$PORT/pipestream?sslmode=disable"
