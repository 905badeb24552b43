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
-- A namespace's newest captures (what reconcile lists) walk this index.
DROP INDEX IF EXISTS provider_captures_namespace;
CREATE INDEX IF NOT EXISTS provider_captures_newest ON provider_captures (namespace, created_at DESC, seq DESC);
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

-- The webhooks the provider owes the lab, written in the statement that
-- records the capture they announce and kept until the lab acknowledges
-- them (delivered) or they are given up (dead): a provider that stops or
-- crashes loses none, and the next one on these records sends them. A
-- capture's webhooks go in seq order. Workers claim due ones with FOR
-- UPDATE SKIP LOCKED, stamping a lease and a random claim token; only the
-- holder of the token completes one. give_up_at ends the retry window.
CREATE TABLE IF NOT EXISTS provider_webhooks (
    capture_id       text        NOT NULL,
    seq              integer     NOT NULL,
    event_id         text        NOT NULL,
    event_type       text        NOT NULL,
    charge_id        text        NOT NULL,
    tenant_id        text        NOT NULL,
    namespace        text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    run_id           text        NOT NULL DEFAULT '',
    body             text        NOT NULL, -- signed anew at each attempt
    forged           boolean     NOT NULL DEFAULT false,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    give_up_at       timestamptz NOT NULL,
    claim_token      uuid,
    lease_expires_at timestamptz,
    last_status      integer     NOT NULL DEFAULT 0,
    last_error       text        NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL,
    done_at          timestamptz,
    PRIMARY KEY (capture_id, seq)
);
CREATE INDEX IF NOT EXISTS provider_webhooks_due ON provider_webhooks (next_attempt_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS provider_webhooks_namespace ON provider_webhooks (namespace);
CREATE INDEX IF NOT EXISTS provider_webhooks_run ON provider_webhooks (run_id);
CREATE INDEX IF NOT EXISTS provider_webhooks_charge ON provider_webhooks (charge_id);

-- Pruning: the receipts and the delivered webhooks are deleted once older
-- than the lab's retention, which outlasts the webhooks' window; the
-- captures never are (the provider's ledger: what the lab is reconciled
-- with, and the keys that keep a late retry from capturing twice), nor a
-- pending or dead webhook. What a deleted row still counts in Stats is
-- added here by the statement that deletes it, per namespace and run.
CREATE TABLE IF NOT EXISTS provider_rollup (
    namespace          text   NOT NULL,
    run_id             text   NOT NULL,
    receipts           bigint NOT NULL DEFAULT 0,
    receipt_deliveries bigint NOT NULL DEFAULT 0,
    webhooks_delivered bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, run_id)
);
CREATE INDEX IF NOT EXISTS provider_webhooks_done_at ON provider_webhooks (done_at) WHERE state = 'delivered';
CREATE INDEX IF NOT EXISTS provider_receipt_events_last ON provider_receipt_events (last_received_at);

-- A webhook is held while an earlier one of its capture is pending: it is
-- written held (every one but a capture's first), and the statement that
-- delivers or gives up the one before releases it. A claim then reads only
-- the webhooks it may send, in next_attempt_at order, instead of probing
-- each candidate's predecessors, which on a table churning faster than its
-- statistics PostgreSQL planned as a scan of every pending row per
-- candidate. Rows written before the column are held here if an earlier
-- one of their capture is pending, as they would have been written; no
-- row written since is released with one pending (the release is in the
-- statement that ends the one before), so on every later start this
-- matches nothing, at the cost of a walk of the pending rows.
ALTER TABLE provider_webhooks ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS provider_webhooks_ready ON provider_webhooks (next_attempt_at) WHERE state = 'pending' AND NOT held;
UPDATE provider_webhooks p SET held = true
WHERE p.state = 'pending' AND p.seq > 0 AND NOT p.held
  AND EXISTS (SELECT 1 FROM provider_webhooks e WHERE e.capture_id = p.capture_id AND e.seq < p.seq AND e.state = 'pending');
