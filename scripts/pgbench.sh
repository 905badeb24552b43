#!/usr/bin/env bash
# Runs the postgres store's charge transaction with pgbench, for comparison
# with `go test -bench PostCharges ./lab/app/` and `-bench . ./variants/postgres/`.
# It works in a scratch schema of its own and drops it at the end.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test scripts/pgbench.sh [seconds] [clients]
set -euo pipefail
cd "$(dirname "$0")/.."

url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
seconds="${1:-10}"
clients="${2:-2}"
schema="idempotency_lab_pgbench_$$"
work=$(mktemp -d)
cleanup() {
  psql -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

psql -q -v ON_ERROR_STOP=1 "$url" -c "CREATE SCHEMA $schema" >/dev/null
PGOPTIONS="-c search_path=$schema" psql -q -v ON_ERROR_STOP=1 "$url" -f variants/postgres/schema.sql >/dev/null

# One fresh-key charge, statement for statement what Store.Charge sends.
cat >"$work/fresh.sql" <<'SQL'
\set n random(1, 2000000000)
BEGIN;
SET LOCAL lock_timeout = 2000;
INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
VALUES ('acme', 'POST /charges', 'pgb-' || :client_id || '-' || :n, 'fingerprint', 'in_flight', now(), now() + make_interval(secs => 86400))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING true;
INSERT INTO charges (id, tenant_id, account, amount_cents, currency, order_id, idempotency_key, store, run_id, replica, created_at)
VALUES ('ch_pgb_' || :client_id || '_' || :n, 'acme', 'acct-1', 2500, 'USD', NULL, 'pgb-' || :client_id || '-' || :n, 'postgres', '', 'pgbench', now())
ON CONFLICT ON CONSTRAINT charges_tenant_order_unique DO NOTHING;
WITH b AS (
  INSERT INTO account_balances AS ab (tenant_id, account, balance_cents) VALUES ('acme', 'acct-1', 2500)
  ON CONFLICT (tenant_id, account) DO UPDATE SET balance_cents = ab.balance_cents + EXCLUDED.balance_cents
  RETURNING balance_cents)
UPDATE charges SET balance_after_cents = b.balance_cents FROM b WHERE charges.id = 'ch_pgb_' || :client_id || '_' || :n
RETURNING b.balance_cents;
INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, run_id, payload, next_attempt_at, created_at)
VALUES (gen_random_uuid(), 'payment_receipt_email', 'ch_pgb_' || :client_id || '_' || :n, 'acme', '', '{"amount_cents":2500}'::jsonb, now(), now());
UPDATE idempotency_requests SET state = 'completed', response_status = 201, response_body = '\x7b7d'::bytea, resource_id = 'ch_pgb_' || :client_id || '_' || :n
WHERE tenant_id = 'acme' AND endpoint = 'POST /charges' AND idempotency_key = 'pgb-' || :client_id || '-' || :n;
COMMIT;
SQL

# A replay: the claim finds the committed row without locking it, then reads it.
cat >"$work/replay.sql" <<'SQL'
BEGIN;
SET LOCAL lock_timeout = 2000;
INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
VALUES ('acme', 'POST /charges', 'replayed', 'fingerprint', 'in_flight', now(), now() + make_interval(secs => 86400))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING true;
SELECT request_fingerprint, state, response_status, response_body, expires_at <= now()
FROM idempotency_requests WHERE tenant_id = 'acme' AND endpoint = 'POST /charges' AND idempotency_key = 'replayed';
ROLLBACK;
SQL
PGOPTIONS="-c search_path=$schema" psql -q "$url" -c "INSERT INTO idempotency_requests VALUES ('acme', 'POST /charges', 'replayed', 'fingerprint', 'completed', 201, '\x7b7d', 'x', now(), now() + interval '1 day')" >/dev/null

for kind in fresh replay; do
  echo "== $kind: $clients clients, ${seconds}s"
  PGOPTIONS="-c search_path=$schema" pgbench -n -M extended -c "$clients" -j "$clients" -T "$seconds" -f "$work/$kind.sql" "$url" |
    grep -E '^(number of transactions actually processed|latency average|tps)'
done
