-- A replay: what the postgres store sends for a key already completed with
-- the same request, one statement outside any transaction (its fast path).
-- Variables: :tenant, :endpoint and :key, the seeded row (seed.sql).
SELECT response_status, response_body FROM idempotency_requests
WHERE tenant_id = :tenant AND endpoint = :endpoint AND idempotency_key = :key
  AND state = 'completed' AND request_fingerprint = '6f1c0f3a9d2be8e1c47f5a0b3d9e2c8f7a1b4d6e9f0c3a5b8d2e7f1a4c6b9d0e' AND expires_at > now() AND response_status IS NOT NULL;
