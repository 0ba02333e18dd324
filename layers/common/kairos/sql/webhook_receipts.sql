-- webhook_receipts: a webhook schedule's idempotency keys, remembered 24 h with the request digest and
-- the run they produced; pruned by the tick (kairos.tick.prune).

-- name: webhook_receipts_find
-- The receipt of an idempotency key of a schedule, unless it has expired.
SELECT request_digest, occurrence_id, run_id
  FROM webhook_receipts
 WHERE schedule_id = %(schedule_id)s
   AND idempotency_key = %(idempotency_key)s
   AND expires_at > coalesce(%(now)s::timestamptz, now());

-- name: webhook_receipts_insert
-- Remembers an idempotency key for 24 h with the digest of its body and the run it produced; an expired
-- receipt of the key (not pruned yet) is replaced, a live one never.
INSERT INTO webhook_receipts (schedule_id, idempotency_key, request_digest, occurrence_id, run_id, generation,
                              created_at, expires_at)
VALUES (%(schedule_id)s, %(idempotency_key)s, %(request_digest)s, %(occurrence_id)s, %(run_id)s, %(generation)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()) + interval '24 hours')
ON CONFLICT (schedule_id, idempotency_key) DO UPDATE
   SET request_digest = excluded.request_digest, occurrence_id = excluded.occurrence_id,
       run_id = excluded.run_id, generation = excluded.generation,
       created_at = excluded.created_at, expires_at = excluded.expires_at
 WHERE webhook_receipts.expires_at <= excluded.created_at
RETURNING run_id;

-- name: webhook_receipts_prune
-- Deletes up to `limit` expired receipts, skipping rows another transaction holds.
DELETE FROM webhook_receipts
 WHERE (schedule_id, idempotency_key) IN (
        SELECT schedule_id, idempotency_key
          FROM webhook_receipts
         WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
         ORDER BY expires_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED);
