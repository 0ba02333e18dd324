-- Idempotent creates: the first 2xx response to an owner's Idempotency-Key, sealed, remembered 24 h.
-- Rows are found by key_digest = SHA-256 of (owner, key); neither is stored in clear (kairos.idempotency).

-- name: idempotency_receipts_lock
-- Serializes the requests that present one (owner, key) until the holder's transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(%(key_digest)s::text, 0));

-- name: idempotency_receipts_find
-- The live receipt of an (owner, key) digest: what the first request was and what it answered.
SELECT request_digest, status, sealed
  FROM idempotency_receipts
 WHERE key_digest = %(key_digest)s
   AND expires_at > coalesce(%(now)s::timestamptz, now());

-- name: idempotency_receipts_insert
-- Remembers a first response for 24 h; an expired receipt of the same digest (not pruned yet) is replaced.
INSERT INTO idempotency_receipts (key_digest, request_digest, status, sealed, created_at, expires_at)
VALUES (%(key_digest)s, %(request_digest)s, %(status)s, %(sealed)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()) + interval '24 hours')
ON CONFLICT (key_digest) DO UPDATE
   SET request_digest = excluded.request_digest, status = excluded.status, sealed = excluded.sealed,
       created_at = excluded.created_at, expires_at = excluded.expires_at
 WHERE idempotency_receipts.expires_at <= excluded.created_at
RETURNING key_digest;

-- name: idempotency_receipts_prune
-- Deletes up to `limit` expired receipts, skipping rows another transaction holds.
DELETE FROM idempotency_receipts
 WHERE key_digest IN (
        SELECT key_digest
          FROM idempotency_receipts
         WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
         ORDER BY expires_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED);
