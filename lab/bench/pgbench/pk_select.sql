-- The least a replay from PostgreSQL can cost: one single-row primary-key
-- read of the stored response, no transaction around it. Run it with
-- -M prepared. Variables: :tenant, :endpoint and :key (seed.sql's row).
SELECT response_status, response_body FROM idempotency_requests
WHERE tenant_id = :tenant AND endpoint = :endpoint AND idempotency_key = :key;
