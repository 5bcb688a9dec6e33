#!/usr/bin/env bash
# The PostgreSQL server's CPU floor per small document (docs/performance.md,
# Store backends): pgbench writes the rows the PostgreSQL store writes for a
# 4 KiB document (scripts/pg-floor/current.sql), batched better than any
# gateway can (8 documents per transaction, one statement per table), and
# the same with less written per document (lean.sql), and this script sums
# the server's CPU (postmaster and all its processes, /proc) per document.
#
#   scripts/pg-floor.sh URL [SECONDS] [ROUNDS]
#
# URL names a database the gateway has migrated (run `gateway bench --store
# URL` or `gateway serve --store URL` once); its schema is copied into a new
# database <name>_floor on the same server, which is dropped first and left
# behind for inspection. The server must run on this machine. Needs psql,
# pg_dump and pgbench (Debian: postgresql or postgresql-client).
set -euo pipefail

die() { echo "pg-floor: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 URL [SECONDS] [ROUNDS]"
URL="$1" SECS="${2:-8}" ROUNDS="${3:-2}"
here="$(cd "$(dirname "$0")" && pwd)"

bin=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
  [ -x "$d/pgbench" ] && { bin="$d"; break; }
done
[ -n "$bin" ] || bin="$(dirname "$(command -v pgbench || die "pgbench not found; apt-get install -y postgresql")")"
psql() { "$bin/psql" "$@"; }

base="${URL%%\?*}" query=""
[ "$base" = "$URL" ] || query="?${URL#*\?}"
db="${base##*/}"
floor_url="${base%/*}/${db}_floor${query}"
admin_url="${base%/*}/postgres${query}"

psql -qX "$admin_url" -c "DROP DATABASE IF EXISTS ${db}_floor" -c "CREATE DATABASE ${db}_floor" >/dev/null
"$bin/pg_dump" -s "$URL" | psql -qX "$floor_url" >/dev/null
psql -qX "$floor_url" >/dev/null <<'SQL'
INSERT INTO meta VALUES (1, 0, 0, 0) ON CONFLICT DO NOTHING;
-- 4 KiB that do not compress, stored inline: the documents' content.
CREATE TABLE floor_blob4k (b BYTEA);
ALTER TABLE floor_blob4k ALTER COLUMN b SET STORAGE PLAIN;
INSERT INTO floor_blob4k SELECT string_agg(decode(md5(i::text), 'hex'), ''::bytea) FROM generate_series(1, 256) i;
-- lean.sql only
CREATE TABLE floor_event_blocks (first_seq BIGINT PRIMARY KEY, last_seq BIGINT NOT NULL, body BYTEA NOT NULL);
ALTER TABLE documents ADD COLUMN content BYTEA;
SQL

datadir="$(psql -qXAt "$floor_url" -c "SHOW data_directory")"
pm="$(head -1 "$datadir/postmaster.pid" 2>/dev/null)" && [ -r "/proc/$pm/stat" ] ||
  die "cannot read the postmaster's pid from $datadir/postmaster.pid or its /proc entry: run PostgreSQL on this machine and this script as root or its owner"

# cpu: clock ticks of the postmaster, its live children and its reaped ones.
cpu() {
  local t=0 f l
  for f in /proc/[0-9]*/stat; do
    read -r l <"$f" 2>/dev/null || continue
    l="${l##*) }"; set -- $l
    [ "$2" = "$pm" ] && t=$((t + ${12} + ${13}))
  done
  read -r l <"/proc/$pm/stat"; l="${l##*) }"; set -- $l
  echo $((t + ${12} + ${13} + ${14} + ${15}))
}

echo "server: postmaster $pm, $(psql -qXAt "$floor_url" -c "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')"); one pgbench client, ${SECS}s per run"
for round in $(seq 1 "$ROUNDS"); do
  for script in current lean; do
    c0="$(cpu)"
    out="$("$bin/pgbench" -n -M prepared -c 1 -j 1 -T "$SECS" -f "$here/pg-floor/$script.sql" "$floor_url" 2>&1)" ||
      die "pgbench $script.sql failed: $out"
    c1="$(cpu)"
    runs="$(awk '/number of transactions actually processed/ { split($NF, a, "/"); print a[1] }' <<<"$out")"
    docs=$((runs * 8))
    [ "$docs" -gt 0 ] || die "pgbench $script.sql processed nothing: $out"
    printf 'round %d %-8s %7d docs  server CPU %6d ms  %5d µs/doc\n' "$round" "$script" "$docs" $(((c1 - c0) * 10)) $(((c1 - c0) * 10000 / docs))
  done
done
