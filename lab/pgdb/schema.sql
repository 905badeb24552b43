-- The lab's own tables. They live in the lab's schema (search_path), never
-- beside the user's tables; every statement is safe to run again.

CREATE TABLE IF NOT EXISTS idempotency_requests (
    tenant_id           text        NOT NULL,
    endpoint            text        NOT NULL,
    idempotency_key     text        NOT NULL,
    request_fingerprint text        NOT NULL,
    state               text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    response_status     integer,
    response_body       bytea,      -- replayed byte for byte, so not jsonb
    resource_id         text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, endpoint, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idempotency_requests_expires_at ON idempotency_requests (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_requests_created_at ON idempotency_requests (created_at DESC);

-- The ledger: one row per applied charge.
CREATE TABLE IF NOT EXISTS charges (
    id              text        PRIMARY KEY,
    tenant_id       text        NOT NULL,
    account         text        NOT NULL,
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    currency        text        NOT NULL CHECK (length(currency) = 3),
    order_id        text,
    idempotency_key text        NOT NULL DEFAULT '',
    store           text        NOT NULL,
    run_id          text        NOT NULL DEFAULT '',
    replica         text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    -- The permanent domain key: one charge per order, whatever the key's retention.
    CONSTRAINT charges_tenant_order_unique UNIQUE (tenant_id, order_id)
);
-- The balance right after the charge, so a charge can be answered again from
-- the ledger when its commit's outcome was not known to the caller.
ALTER TABLE charges ADD COLUMN IF NOT EXISTS balance_after_cents bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS charges_run ON charges (run_id);
CREATE INDEX IF NOT EXISTS charges_key ON charges (tenant_id, store, idempotency_key);
-- An account's balance is summed from the ledger (Balance): from this
-- index alone, not a heap page per charge.
DROP INDEX IF EXISTS charges_account;
CREATE INDEX IF NOT EXISTS charges_account_amount ON charges (tenant_id, account) INCLUDE (amount_cents);

-- Balances, kept in the charge's transaction so a charge costs one row
-- update instead of a sum over the account's history. Derived from the
-- ledger: sum(charges.amount_cents) per account always equals it.
CREATE TABLE IF NOT EXISTS account_balances (
    tenant_id     text   NOT NULL,
    account       text   NOT NULL,
    balance_cents bigint NOT NULL,
    PRIMARY KEY (tenant_id, account)
);

-- The transactional outbox: effects recorded with their charge.
CREATE TABLE IF NOT EXISTS outbox (
    event_id        uuid        PRIMARY KEY,
    event_type      text        NOT NULL,
    charge_id       text        NOT NULL REFERENCES charges (id) ON DELETE CASCADE,
    tenant_id       text        NOT NULL,
    run_id          text        NOT NULL DEFAULT '',
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (next_attempt_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (run_id);
CREATE INDEX IF NOT EXISTS outbox_charge ON outbox (charge_id);

-- The provider's receipts moved to the provider's own records (provider.sql).
DROP TABLE IF EXISTS provider_receipts;

-- Namespaces: the part of the lab each attendee owns (a tenant and its
-- second tenant, named tenant~2). Derived from the tenant, so no writer
-- can get it wrong.
ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS namespace text GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED;
CREATE INDEX IF NOT EXISTS idempotency_requests_namespace ON idempotency_requests (namespace, created_at DESC);
ALTER TABLE charges ADD COLUMN IF NOT EXISTS namespace text GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED;
-- A namespace's newest charges (what reconcile lists) walk this index
-- instead of sorting the namespace's whole ledger.
DROP INDEX IF EXISTS charges_namespace;
CREATE INDEX IF NOT EXISTS charges_namespace_created ON charges (namespace, created_at DESC, id);
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS namespace text GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED;
CREATE INDEX IF NOT EXISTS outbox_namespace ON outbox (namespace, created_at DESC);
-- The relay's fence: a claim stamps its random token and its lease, and only
-- the holder of the token may complete the event.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS claim_token uuid;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_expires_at timestamptz;

-- Tenants that joined the lab: only the SHA-256 of their token is kept.
CREATE TABLE IF NOT EXISTS lab_tenants (
    token_sha256 text        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    joined_at    timestamptz NOT NULL DEFAULT now()
);

-- The payment's state, moved only by verified provider webhooks (pending →
-- succeeded | failed, never back), and the webhooks processed, one row per
-- provider event id: the unique key that makes a redelivery change nothing.
ALTER TABLE charges ADD COLUMN IF NOT EXISTS payment_state text NOT NULL DEFAULT 'pending'
    CHECK (payment_state IN ('pending', 'succeeded', 'failed'));
CREATE TABLE IF NOT EXISTS webhook_events (
    event_id     text        PRIMARY KEY,
    event_type   text        NOT NULL,
    charge_id    text        NOT NULL,
    tenant_id    text        NOT NULL,
    namespace    text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    state_before text        NOT NULL,
    state_after  text        NOT NULL,
    received_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_events_charge ON webhook_events (charge_id);
CREATE INDEX IF NOT EXISTS webhook_events_namespace ON webhook_events (namespace);

-- The lease store: two phases. Phase one commits the claim with a lease and
-- a fencing token that rises with every take-over; the work runs outside
-- any transaction; phase two writes the charge carrying that token.
CREATE TABLE IF NOT EXISTS lease_requests (
    tenant_id           text        NOT NULL,
    endpoint            text        NOT NULL,
    idempotency_key     text        NOT NULL,
    request_fingerprint text        NOT NULL,
    state               text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    attempt_token       bigint      NOT NULL,
    lease_expires_at    timestamptz NOT NULL,
    charge_id           text        NOT NULL,
    response_status     integer,
    response_body       bytea,
    created_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    namespace           text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    PRIMARY KEY (tenant_id, endpoint, idempotency_key)
);
CREATE INDEX IF NOT EXISTS lease_requests_namespace ON lease_requests (namespace, created_at DESC);
-- Fencing tokens come from one sequence: a take-over's token is higher than
-- every token issued before, and a key swept and claimed anew never gets a
-- token a stale worker could still hold.
CREATE SEQUENCE IF NOT EXISTS lease_tokens;
-- Never below a token already issued (rows from before the sequence existed).
SELECT setval('lease_tokens', m) FROM (SELECT max(attempt_token) AS m FROM lease_requests) t
WHERE m IS NOT NULL AND m > (SELECT last_value FROM lease_tokens);
CREATE INDEX IF NOT EXISTS lease_requests_expires_at ON lease_requests (expires_at);

-- The phases store: a request in atomic phases, each committing its writes
-- with the key's recovery point. The row is locked (lock_token, rising from
-- phase_tokens, and locked_until) while a request or the completer works on
-- it; every phase's transaction first re-takes the lock by its token, so a
-- worker whose lock was taken over writes nothing more.
CREATE TABLE IF NOT EXISTS phase_requests (
    tenant_id           text        NOT NULL,
    endpoint            text        NOT NULL,
    idempotency_key     text        NOT NULL,
    request_fingerprint text        NOT NULL,
    request             jsonb       NOT NULL, -- what the completer needs to finish it
    recovery_point      text        NOT NULL CHECK (recovery_point IN ('started', 'charge_created', 'provider_called', 'finished')),
    lock_token          bigint      NOT NULL,
    locked_until        timestamptz NOT NULL,
    charge_id           text        NOT NULL,
    capture_id          text,
    response_status     integer,
    response_body       bytea,
    completed_by        text        CHECK (completed_by IN ('request', 'completer')),
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    namespace           text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    PRIMARY KEY (tenant_id, endpoint, idempotency_key)
);
CREATE INDEX IF NOT EXISTS phase_requests_namespace ON phase_requests (namespace, created_at DESC);
-- What the completer looks for: keys short of finished, oldest first.
CREATE INDEX IF NOT EXISTS phase_requests_unfinished ON phase_requests (updated_at) WHERE recovery_point <> 'finished';
CREATE INDEX IF NOT EXISTS phase_requests_expires_at ON phase_requests (expires_at) WHERE recovery_point = 'finished';
CREATE SEQUENCE IF NOT EXISTS phase_tokens;

-- The resource checks the fence, not the worker: a ledger row carrying a
-- fencing token is refused unless the token is still its key's current
-- one (SQLSTATE LF001). The key row is locked while checking, so a
-- take-over and a stale write are serialised.
ALTER TABLE charges ADD COLUMN IF NOT EXISTS fence_token bigint;
CREATE OR REPLACE FUNCTION lab_check_fence() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    current_token bigint;
BEGIN
    IF NEW.fence_token IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT attempt_token INTO current_token FROM lease_requests
    WHERE tenant_id = NEW.tenant_id AND endpoint = 'POST /charges' AND idempotency_key = NEW.idempotency_key
    FOR UPDATE;
    IF current_token IS DISTINCT FROM NEW.fence_token THEN
        RAISE EXCEPTION 'stale fencing token % for key %: the current token is %', NEW.fence_token, NEW.idempotency_key, current_token
            USING ERRCODE = 'LF001';
    END IF;
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER charges_check_fence BEFORE INSERT ON charges FOR EACH ROW EXECUTE FUNCTION lab_check_fence();

-- Writes the fence refused, as the stale worker reports them.
CREATE TABLE IF NOT EXISTS fenced_writes (
    tenant_id       text        NOT NULL,
    idempotency_key text        NOT NULL,
    stale_token     bigint      NOT NULL,
    charge_id       text        NOT NULL,
    run_id          text        NOT NULL DEFAULT '',
    refused_at      timestamptz NOT NULL,
    namespace       text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED
);
CREATE INDEX IF NOT EXISTS fenced_writes_run ON fenced_writes (run_id);

-- The keys of the redis+postgres design: PostgreSQL decides as the
-- postgres design does, in a table of its own so the two never share a key.
CREATE TABLE IF NOT EXISTS cached_requests (LIKE idempotency_requests INCLUDING ALL);

-- The runs the lab opened, each in one namespace: a charge tagged with a
-- run (Lab-Run) must be of that namespace, so nobody's charges count in
-- another's run, whichever replica answers.
CREATE TABLE IF NOT EXISTS lab_runs (
    run_id    text        PRIMARY KEY,
    namespace text        NOT NULL,
    opened_at timestamptz NOT NULL
);
-- The captures the lab made of each charge, as the provider answered its
-- capture calls (the relay's, or a direct send's): a webhook moves a
-- charge only when it names one of them, for the charge's amount and
-- currency. No foreign key: a direct send captures before its charge is
-- written, and a rolled-back charge never is. settled turns true when a
-- webhook moved the charge; the partial index finds the ones still waiting.
CREATE TABLE IF NOT EXISTS charge_captures (
    charge_id   text        NOT NULL,
    capture_id  text        NOT NULL,
    tenant_id   text        NOT NULL,
    namespace   text        GENERATED ALWAYS AS (split_part(tenant_id, '~', 1)) STORED,
    recorded_at timestamptz NOT NULL,
    settled     boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (charge_id, capture_id)
);
CREATE INDEX IF NOT EXISTS charge_captures_namespace ON charge_captures (namespace);
CREATE INDEX IF NOT EXISTS charge_captures_waiting ON charge_captures (recorded_at) WHERE NOT settled;
-- What each processed webhook said of its capture, and, when it did not
-- match its charge, why (it was recorded and moved nothing).
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS capture_id text NOT NULL DEFAULT '';
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS amount_cents bigint NOT NULL DEFAULT 0;
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS currency text NOT NULL DEFAULT '';
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS mismatch text;

-- Pruning: delivered outbox events and the webhook event ids the lab
-- processed are deleted once older than the retention (the app's pruner,
-- in batches); the ledger never is, nor a pending or dead event, nor a
-- webhook event that did not match its charge (what reconcile reports).
-- The totals a deleted event still counts in are added here by the
-- statement that deletes it: per namespace and run, how many events were
-- delivered, and the attempts they took beyond their first.
CREATE TABLE IF NOT EXISTS outbox_rollup (
    namespace text   NOT NULL,
    run_id    text   NOT NULL,
    delivered bigint NOT NULL,
    retries   bigint NOT NULL,
    PRIMARY KEY (namespace, run_id)
);
-- The pruner walks the delivered events oldest first; the counts read the
-- delivered ones of a namespace from an index alone, and the others (few,
-- whatever the table holds) from a partial index of their own.
CREATE INDEX IF NOT EXISTS outbox_delivered_at ON outbox (delivered_at) WHERE state = 'delivered';
CREATE INDEX IF NOT EXISTS outbox_delivered_namespace ON outbox (namespace) INCLUDE (attempts) WHERE state = 'delivered';
CREATE INDEX IF NOT EXISTS outbox_open ON outbox (namespace) WHERE state <> 'delivered';
CREATE INDEX IF NOT EXISTS webhook_events_received_at ON webhook_events (received_at) WHERE mismatch IS NULL;
