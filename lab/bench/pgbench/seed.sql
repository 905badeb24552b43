-- The completed key replay.sql and pk_select.sql read: tenant acme,
-- endpoint 'POST /charges', key 'replayed', a charge's stored response.
INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, response_status, response_body, resource_id, created_at, expires_at)
VALUES ('acme', 'POST /charges', 'replayed', '6f1c0f3a9d2be8e1c47f5a0b3d9e2c8f7a1b4d6e9f0c3a5b8d2e7f1a4c6b9d0e', 'completed', 201,
        convert_to('{"id":"ch_pgb_seed","account":"acct-1","amount_cents":2500,"currency":"USD","balance_cents":2500,"created_at":"2026-01-01T00:00:00Z"}', 'UTF8'),
        'ch_pgb_seed', now(), now() + interval '1 day')
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING;
