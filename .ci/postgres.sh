#!/usr/bin/env bash
# Usage: .ci/postgres.sh COMMAND [ARG...]
#
# Runs COMMAND with a throwaway PostgreSQL server and TICKETING_TEST_PG_DSN
# pointing at an empty database on it, then stops the server and removes
# its files. The cluster is initdb'd in a temporary directory, owned by the
# `postgres` system user when run as root (PostgreSQL refuses to run as
# root), listening on 127.0.0.1 at a free port (and a unix socket in the
# same directory), with trust authentication and fsync off: a test fixture,
# not a server.
#
# If TICKETING_TEST_PG_DSN is already set, COMMAND runs against that server
# and nothing is started (so nested calls, e.g. .ci/run -> make test, start
# one server). Needs Debian's postgresql package (apt-get install postgresql)
# or any PostgreSQL whose initdb/pg_ctl are found below.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
fi
if [ -n "${TICKETING_TEST_PG_DSN:-}" ]; then
  exec "$@"
fi

bindir=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
  if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then bindir=$d; break; fi
done
if [ -z "$bindir" ] && command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
  bindir=$(dirname "$(command -v initdb)")
fi
if [ -z "$bindir" ]; then
  echo "postgres.sh: no initdb/pg_ctl found; install PostgreSQL (apt-get install -y postgresql)" >&2
  exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/tk-pg-XXXXXX")
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$dir"
  as_pg=(runuser -u postgres --)
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

stop() {
  "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
trap 'exit 130' INT TERM

# cd: the postgres user may not be allowed into the caller's directory.
(cd "$dir" && "${as_pg[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust \
  --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1) || {
  cat "$dir/initdb.log" >&2
  exit 1
}
(cd "$dir" && "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" \
  start >/dev/null) || {
  cat "$dir/server.log" >&2
  exit 1
}
(cd "$dir" && "${as_pg[@]}" "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt \
  -c "CREATE DATABASE ticketing_test") >/dev/null

export TICKETING_TEST_PG_DSN="postgres://postgres@127.0.0.1:$port/ticketing_test?sslmode=disable"
echo "postgres.sh: PostgreSQL $("$bindir/pg_ctl" --version | awk '{print $3}') at $TICKETING_TEST_PG_DSN" >&2
set +e
"$@"
rc=$?
set -e
exit $rc
