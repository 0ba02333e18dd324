-- notify_deliveries: the outbox of run-ending webhooks (kairos.notify, kairos.tick.deliver).

-- name: notify_deliveries_add
-- Owes one delivery for an ended run (the settle step, in the transaction that settles it); a run
-- already owed one keeps it, so a run is reported at most once.
INSERT INTO notify_deliveries (run_id, schedule_id, owner, url, secret_ref, next_attempt_at, created_at)
VALUES (%(run_id)s, %(schedule_id)s, %(owner)s, %(url)s, %(secret_ref)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: notify_deliveries_claim
-- Claims the oldest due pending delivery (skipping one another tick holds): counts the attempt and
-- moves next_attempt_at past the lease, so no other tick sends it while this one does; returns what
-- the webhook says (the run's state, and a bounded preview of a succeeded run's answer).
WITH claimed AS (
    UPDATE notify_deliveries AS d
       SET attempts = d.attempts + 1,
           next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s)
     WHERE d.run_id = (SELECT p.run_id
                         FROM notify_deliveries p
                        WHERE p.state = 'pending' AND p.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
                        ORDER BY p.next_attempt_at, p.run_id
                        LIMIT 1
                          FOR UPDATE SKIP LOCKED)
    RETURNING d.run_id, d.schedule_id, d.owner, d.url, d.secret_ref, d.attempts, d.created_at
)
SELECT c.run_id, c.schedule_id, c.owner, c.url, c.secret_ref, c.attempts, c.created_at, r.state,
       s.conversation_id, left(e.content, %(preview)s) AS output_text, coalesce(%(now)s::timestamptz, now()) AS now
  FROM claimed c
  JOIN runs r ON r.id = c.run_id
  JOIN schedules s ON s.id = c.schedule_id
  LEFT JOIN conversation_entries e
         ON r.state = 'succeeded' AND e.role = 'assistant'
        AND e.conversation_id = (r.output ->> 'conversation_id')::uuid
        AND e.seq = (r.output ->> 'entry_seq')::integer;

-- name: notify_deliveries_delivered
-- pending -> delivered: the receiver accepted (a 2xx). Whichever claim sent it, it is never sent again.
UPDATE notify_deliveries
   SET state = 'delivered', last_status = %(status)s, last_error = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state = 'pending'
RETURNING run_id;

-- name: notify_deliveries_retry
-- A failed attempt: the next one after the backoff, unless a later claim of this delivery owns it now.
UPDATE notify_deliveries
   SET next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay_seconds)s),
       last_status = %(status)s, last_error = %(error)s
 WHERE run_id = %(run_id)s AND state = 'pending' AND attempts = %(attempts)s
RETURNING run_id;

-- name: notify_deliveries_give_up
-- pending -> gave_up: a permanent refusal, or retrying past the 24 h bound; guarded like the retry.
UPDATE notify_deliveries
   SET state = 'gave_up', last_status = %(status)s, last_error = %(error)s,
       finished_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state = 'pending' AND attempts = %(attempts)s
RETURNING run_id;
