-- A fresh-key charge: statement for statement, and round trip for round
-- trip, what the postgres store (variants/postgres/store.go) sends for a
-- new key: BEGIN, the lock timeout, the claim, the charge (its row, its
-- outbox event, the balance recorded on it), the stored response, COMMIT.
-- The account is drawn from :accounts: with 1, every transaction adds to
-- the same balance row and its lock serializes them, as on the lab's hot
-- account; with 1,000 those locks rarely meet.
-- Variables: :tenant, :endpoint and :accounts (pgbench -D), :client_id.
\set n random(1, 1000000000000000)
\set a random(1, :accounts)
BEGIN ISOLATION LEVEL READ COMMITTED;
SET LOCAL lock_timeout = 2000;
INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
VALUES (:tenant, :endpoint, 'pgb-' || :client_id || '-' || :n, '6f1c0f3a9d2be8e1c47f5a0b3d9e2c8f7a1b4d6e9f0c3a5b8d2e7f1a4c6b9d0e', 'in_flight', now(), now() + make_interval(secs => 86400))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING true;
INSERT INTO charges (id, tenant_id, account, amount_cents, currency, order_id, idempotency_key, store, run_id, replica, created_at, fence_token)
VALUES ('ch_pgb_' || :client_id || '_' || :n, :tenant, 'acct-' || :a, 2500, 'USD', NULL, 'pgb-' || :client_id || '-' || :n, 'postgres', 'pgbench', 'pgbench', now(), NULL)
ON CONFLICT DO NOTHING;
INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, run_id, payload, next_attempt_at, created_at)
VALUES (gen_random_uuid(), 'payment_receipt_email', 'ch_pgb_' || :client_id || '_' || :n, :tenant, 'pgbench', '{"amount_cents":2500,"currency":"USD","account":"acct-1"}'::jsonb, now(), now());
WITH b AS (
  INSERT INTO account_balances AS ab (tenant_id, account, balance_cents) VALUES (:tenant, 'acct-' || :a, 2500)
  ON CONFLICT (tenant_id, account) DO UPDATE SET balance_cents = ab.balance_cents + EXCLUDED.balance_cents
  RETURNING balance_cents)
UPDATE charges SET balance_after_cents = b.balance_cents FROM b WHERE charges.id = 'ch_pgb_' || :client_id || '_' || :n
RETURNING b.balance_cents;
UPDATE idempotency_requests SET state = 'completed', response_status = 201, resource_id = 'ch_pgb_' || :client_id || '_' || :n,
  response_body = convert_to('{"id":"ch_pgb","account":"acct-1","amount_cents":2500,"currency":"USD","balance_cents":2500,"created_at":"2026-01-01T00:00:00Z"}', 'UTF8')
WHERE tenant_id = :tenant AND endpoint = :endpoint AND idempotency_key = 'pgb-' || :client_id || '-' || :n;
COMMIT;
