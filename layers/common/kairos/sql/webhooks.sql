-- Webhook intake: token lookup, rate window, idempotency receipts, the occurrence and run of one
-- accepted delivery, and token rotation. Every webhook of one schedule takes the schedule row lock
-- (FOR NO KEY UPDATE) first, so the rate window and the receipt check see every earlier delivery.

-- name: schedules_find_hook
-- The active webhook schedule presenting this token hash (current, or previous before it expires), locked, with the database time.
SELECT s.id, s.owner, s.conversation_id, s.prompt, s.mode, s.catch_up, s.timezone, s.revision, s.signing,
       s.rate_limit_per_minute, s.token_hash, s.previous_token_hash,
       coalesce(s.agent, c.agent) AS agent,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM schedules s
  JOIN conversations c ON c.id = s.conversation_id
 WHERE s.kind = 'webhook'
   AND s.status = 'active'
   AND (s.token_hash = %(token_hash)s
        OR (s.previous_token_hash = %(token_hash)s
            AND s.previous_token_expires_at > coalesce(%(now)s::timestamptz, now())))
   FOR NO KEY UPDATE OF s;

-- name: occurrences_hook_window
-- The fire time of the n-th newest webhook occurrence of a schedule in the last 60 s (no row: under the limit).
SELECT fire_at
  FROM occurrences
 WHERE schedule_id = %(schedule_id)s
   AND source = 'webhook'
   AND fire_at > coalesce(%(now)s::timestamptz, now()) - interval '60 seconds'
 ORDER BY fire_at DESC
OFFSET %(offset)s
 LIMIT 1;

-- name: webhook_receipts_find
-- The receipt of an idempotency key of a schedule, unless it has expired.
SELECT request_digest, occurrence_id, run_id
  FROM webhook_receipts
 WHERE schedule_id = %(schedule_id)s
   AND idempotency_key = %(idempotency_key)s
   AND expires_at > coalesce(%(now)s::timestamptz, now());

-- name: occurrences_hook_key_generation
-- The generation the next use of a webhook key makes: one past the newest occurrence it made, else 0.
SELECT coalesce(max(key_generation) + 1, 0) AS generation
  FROM occurrences
 WHERE schedule_id = %(schedule_id)s
   AND source = 'webhook'
   AND idempotency_key = %(idempotency_key)s;

-- name: occurrences_insert_hook
-- The immutable occurrence of one accepted webhook delivery (zero rows: its key was seen before).
INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,
                         tzdata_version, schedule_revision, decision, idempotency_key, key_generation, created_at)
VALUES (%(id)s, %(schedule_id)s, 'webhook', %(fire_at)s, %(local_time)s, %(utc_offset)s, %(fold)s, %(timezone)s,
        %(tzdata_version)s, %(schedule_revision)s, 'dispatched', %(idempotency_key)s, %(key_generation)s,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING id;

-- name: runs_insert_hook
-- The queued run of a webhook occurrence, carrying the delivery's payload and the schedule's agent snapshot.
INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode, prompt, payload,
                  agent, catch_up, created_at, updated_at)
VALUES (%(id)s, %(occurrence_id)s, %(schedule_id)s, %(owner)s, 'webhook', %(conversation_id)s, %(mode)s,
        %(prompt)s, %(payload)s, %(agent)s, %(catch_up)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING id;

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

-- name: schedules_rotate_token
-- Replaces a webhook schedule's token hash; the old hash stays valid for the overlap (none when 0 s).
UPDATE schedules
   SET previous_token_hash = CASE WHEN %(overlap_seconds)s::integer > 0 THEN token_hash END,
       previous_token_expires_at = CASE WHEN %(overlap_seconds)s::integer > 0
                                        THEN coalesce(%(now)s::timestamptz, now())
                                             + make_interval(secs => %(overlap_seconds)s::integer)
                                   END,
       token_hash = %(token_hash)s,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s
   AND owner = %(owner)s
   AND kind = 'webhook'
   AND status IN ('active', 'paused')
RETURNING id, revision, previous_token_expires_at;
