-- A webhook run held by its flow (a debounce or batch window still open, a delivery deferred by the
-- hook's rate: held_until ahead, kairos.flow) waits for its window, not for a slot: the release passes
-- it by until it is due, so an open window no longer sits on one of its owner's slots for as long as
-- ten windows. Its timer (the delayed message the intake sends) reaches a claim that takes it when the
-- owner has a slot to spare; otherwise it waits, due, for the next release like any queued run.

CREATE OR REPLACE FUNCTION kairos_release_slots(p_owner text, p_released_by uuid, p_now timestamptz)
RETURNS SETOF uuid LANGUAGE plpgsql AS $$
DECLARE
    v_held integer;
    v_limit integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || p_owner, 0));
    SELECT w.slot_limit INTO v_limit
      FROM runs w
     WHERE w.owner = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
       AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
       AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
     ORDER BY w.created_at, w.id
     LIMIT 1;
    IF v_limit IS NULL THEN
        RETURN;  -- nothing waits
    END IF;
    SELECT count(*) INTO v_held
      FROM runs h
     WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL);
    IF v_held >= v_limit THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH holders AS (
        SELECT h.schedule_id, h.concurrency_key
          FROM runs h
         WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL)
           AND h.concurrency_key IS NOT NULL
    ), candidates AS (
        SELECT w.id, w.schedule_id, w.concurrency_key, w.concurrency_limit, w.created_at
          FROM runs w
         WHERE w.owner = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
           AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
           AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
         ORDER BY w.created_at, w.id
         LIMIT 100
    ), ranked AS (
        SELECT c.id, c.created_at,
               c.concurrency_key IS NULL
               OR row_number() OVER (PARTITION BY c.schedule_id, c.concurrency_key ORDER BY c.created_at, c.id)
                  + (SELECT count(*) FROM holders h
                      WHERE h.schedule_id = c.schedule_id AND h.concurrency_key = c.concurrency_key)
                  <= c.concurrency_limit AS fits
          FROM candidates c
    ), chosen AS (
        SELECT r.id FROM ranked r WHERE r.fits ORDER BY r.created_at, r.id LIMIT v_limit - v_held
    ), admitted AS (
        UPDATE runs u
           SET admitted_at = coalesce(p_now, now()),
               released_by = p_released_by,
               updated_at = coalesce(p_now, now())
          FROM chosen
         WHERE u.id = chosen.id AND u.state = 'queued' AND u.admitted_at IS NULL
           AND u.blocked_by_run_id IS NULL AND u.paused_at IS NULL
           AND (u.held_until IS NULL OR u.held_until <= coalesce(p_now, now()))
        RETURNING u.id
    )
    SELECT a.id FROM admitted a;
END;
$$;

-- What a queued run waits for: a held run waits for its window (NULL here; held_until says it).
CREATE OR REPLACE FUNCTION kairos_waiting_for(r runs) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN r.state <> 'queued' OR r.admitted_at IS NOT NULL OR r.blocked_by_run_id IS NOT NULL
             OR r.paused_at IS NOT NULL OR r.held_until > now() THEN NULL
        WHEN r.concurrency_key IS NOT NULL
             AND (SELECT count(*) FROM runs k
                   WHERE k.owner = r.owner AND (k.state = 'running' OR k.admitted_at IS NOT NULL)
                     AND k.schedule_id = r.schedule_id AND k.concurrency_key = r.concurrency_key)
                 >= r.concurrency_limit THEN 'key'
        ELSE 'slot'
    END
$$;
