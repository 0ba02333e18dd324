-- The looks for an owner's waiting runs are served by runs_slot_waiting_idx whatever the statistics say
-- (kairos.budgets, "Slots"; what each look decides is unchanged).
--
-- 0044 asked a run end's look in the partial index's order, so that the index is the cheapest plan. It
-- is not always: the planner costs a partial index by its pages and the entries ANALYZE counted, and
-- the owner's other runs' rows by taking the look's conditions for independent. When every run waited
-- once since the last VACUUM (each left an entry, now dead, in the waiting index) and `runs` was
-- analyzed while the owners' fresh runs held slots (half their runs queued, half without a slot: "a
-- quarter wait"), the index looks dear and a walk of the owner's runs in creation order
-- (runs_owner_created_idx, backwards) cheap: none waits, and the walk read every run of the owner at
-- every end, its history first (tests/db/test_stale_statistics.py: 401 rows an end, 100 owners of 400
-- runs). The tick's fire had met the same walk (benchmarks, "server share"). Extended statistics on
-- (state, admitted_at) made it worse there (a walk of runs_owner_active_idx); on
-- (state, (admitted_at IS NULL)) they changed no estimate (the look's `admitted_at IS NULL` is not
-- matched to that expression).
--
-- The index's owner key now sorts by the "C" collation, and its readers compare `owner COLLATE "C"`
-- (equality is the same under every deterministic collation): no other index of `runs` can serve
-- that comparison, so the plans left to the planner are this index or reading every run, whatever the
-- estimates. runs_waiting_owners lists the owners in that order, which the index gives.
DROP INDEX runs_slot_waiting_idx;
CREATE INDEX runs_slot_waiting_idx ON runs (owner COLLATE "C", created_at, id)
    WHERE state = 'queued' AND admitted_at IS NULL AND blocked_by_run_id IS NULL AND paused_at IS NULL;

CREATE OR REPLACE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('kairos.owner_slots:' || NEW.owner, 0));
    PERFORM 1 FROM runs w
      WHERE w.owner COLLATE "C" = NEW.owner AND w.state = 'queued' AND w.admitted_at IS NULL
        AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
      ORDER BY w.created_at, w.id
      LIMIT 1;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slot_ends:' || NEW.owner, 0));
        PERFORM kairos_admit_waiting(NEW.owner, NEW.id, NULL);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION kairos_admit_waiting(p_owner text, p_released_by uuid, p_now timestamp with time zone) RETURNS SETOF uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_held integer;
    v_limit integer;
BEGIN
    SELECT w.slot_limit INTO v_limit
      FROM runs w
     WHERE w.owner COLLATE "C" = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
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
         WHERE w.owner COLLATE "C" = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
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
