-- Idempotency keys that expire for real, and idempotent creates (issue 10, item 3).
--
-- A webhook receipt says when it expires (`expires_at`, the column black-box tests move). Once it
-- has expired the key is new again: the next delivery with it is a new occurrence, told apart from
-- the earlier ones by `key_generation` (0 for the first use, then 1, 2, ...), which is part of the
-- occurrence's deterministic id. The receipt records the generation it answers for.
ALTER TABLE webhook_receipts ADD COLUMN expires_at timestamptz;
UPDATE webhook_receipts SET expires_at = created_at + interval '24 hours';
ALTER TABLE webhook_receipts ALTER COLUMN expires_at SET NOT NULL;
ALTER TABLE webhook_receipts ADD COLUMN generation integer NOT NULL DEFAULT 0 CHECK (generation >= 0);
DROP INDEX webhook_receipts_created_idx;
CREATE INDEX webhook_receipts_expires_idx ON webhook_receipts (expires_at);

-- A constant default: a catalog-only change, no table rewrite, no row update (occurrences refuse updates).
ALTER TABLE occurrences ADD COLUMN key_generation integer NOT NULL DEFAULT 0 CHECK (key_generation >= 0);
DROP INDEX occurrences_keyed_key;
CREATE UNIQUE INDEX occurrences_keyed_key ON occurrences (schedule_id, source, idempotency_key, key_generation)
    WHERE source IN ('webhook', 'manual');

-- Idempotent creates (`POST /v1/schedules`, `POST /v1/conversations` with `Idempotency-Key`): the
-- first 2xx response, remembered 24 h. Neither the key nor the owner is stored in clear: the row is
-- found by `key_digest` = SHA-256 of (owner, key), and the response (a webhook schedule's carries its
-- token, shown once) is sealed with AES-GCM under a key derived (HKDF) from the Idempotency-Key and the
-- owner, so only a caller presenting the key again can read it back (see kairos.idempotency).
CREATE TABLE idempotency_receipts (
    key_digest     text PRIMARY KEY,
    request_digest text NOT NULL,
    status         integer NOT NULL CHECK (status BETWEEN 200 AND 299),
    sealed         bytea NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX idempotency_receipts_expires_idx ON idempotency_receipts (expires_at);
