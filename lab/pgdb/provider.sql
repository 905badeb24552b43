-- The simulated payment provider's own records (package provider).

-- One row per capture the provider applied, unique per (tenant, key): the
-- primary key is what lets exactly one of two concurrent requests apply.
-- requests counts the requests applied or replayed under the key; seq
-- orders captures made in the same microsecond.
CREATE TABLE IF NOT EXISTS provider_captures (
    tenant_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    capture_id      text        NOT NULL UNIQUE,
    charge_id       text        NOT NULL,
    namespace       text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    run_id          text        NOT NULL DEFAULT '',
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    currency        text        NOT NULL,
    via             text        NOT NULL CHECK (via IN ('outbox', 'direct')),
    status          text        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    requests        integer     NOT NULL DEFAULT 1,
    fingerprint     text        NOT NULL,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS provider_captures_namespace ON provider_captures (namespace);
CREATE INDEX IF NOT EXISTS provider_captures_run ON provider_captures (run_id);
CREATE INDEX IF NOT EXISTS provider_captures_charge ON provider_captures (charge_id);

-- One row per receipt event the provider received, however many times.
CREATE TABLE IF NOT EXISTS provider_receipt_events (
    event_id          text        PRIMARY KEY,
    charge_id         text        NOT NULL,
    tenant_id         text        NOT NULL,
    namespace         text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    run_id            text        NOT NULL DEFAULT '',
    via               text        NOT NULL,
    deliveries        integer     NOT NULL DEFAULT 1,
    first_received_at timestamptz NOT NULL,
    last_received_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS provider_receipt_events_namespace ON provider_receipt_events (namespace);
CREATE INDEX IF NOT EXISTS provider_receipt_events_run ON provider_receipt_events (run_id);
CREATE INDEX IF NOT EXISTS provider_receipt_events_charge ON provider_receipt_events (charge_id);
