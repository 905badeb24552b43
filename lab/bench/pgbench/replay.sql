-- A replay: what the postgres store (variants/postgres/store.go) sends for
-- a key already completed with the same request: BEGIN, the lock timeout,
-- the claim that inserts nothing, the read of the committed row, and the
-- rollback of a transaction that wrote nothing.
-- Variables: :tenant, :endpoint and :key, the seeded row (seed.sql).
BEGIN ISOLATION LEVEL READ COMMITTED;
SET LOCAL lock_timeout = 2000;
INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
VALUES (:tenant, :endpoint, :key, '6f1c0f3a9d2be8e1c47f5a0b3d9e2c8f7a1b4d6e9f0c3a5b8d2e7f1a4c6b9d0e', 'in_flight', now(), now() + make_interval(secs => 86400))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING true;
SELECT request_fingerprint, state, response_status, response_body, expires_at <= now()
FROM idempotency_requests WHERE tenant_id = :tenant AND endpoint = :endpoint AND idempotency_key = :key;
ROLLBACK;
