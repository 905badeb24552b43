#!/usr/bin/env bash
# Runs the postgres store's statements with pgbench: a fresh-key charge on
# one hot account, one on 1,000 accounts, a replay, and the single-row
# primary-key read a replay cannot beat. The statements are the files
# `lab bench` embeds (lab/bench/pgbench/), so both measure the same thing;
# `go run ./cmd/lab bench` puts these figures beside the lab's own over HTTP.
# It works in a scratch schema of its own and drops it at the end.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test scripts/pgbench.sh [seconds] [clients]
set -euo pipefail
cd "$(dirname "$0")/.."

url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
seconds="${1:-10}"
clients="${2:-2}"
schema="idempotency_lab_pgbench_$$"
sql=lab/bench/pgbench
cleanup() {
  psql -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

psql -q -v ON_ERROR_STOP=1 "$url" -c "CREATE SCHEMA $schema" >/dev/null
export PGOPTIONS="-c search_path=$schema -c client_min_messages=warning"
psql -q -v ON_ERROR_STOP=1 "$url" -f lab/pgdb/schema.sql >/dev/null
psql -q -v ON_ERROR_STOP=1 "$url" -f "$sql/seed.sql" >/dev/null

# -M prepared: pgx, the lab's driver, prepares and caches its statements too.
# name, script, its accounts (1: the hot account, whose row lock serializes the charges).
for run in "fresh_hot fresh 1" "fresh_many fresh 1000" "replay replay 1" "pk_select pk_select 1"; do
  read -r name script accounts <<<"$run"
  echo "== $name: $clients clients, ${seconds}s"
  pgbench -n -M prepared -c "$clients" -j "$clients" -T "$seconds" \
    -D tenant=acme -D "endpoint=POST /charges" -D key=replayed -D "accounts=$accounts" -f "$sql/$script.sql" "$url" |
    grep -E '^(number of transactions actually processed|latency average|tps)'
done
