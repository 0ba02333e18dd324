-- Runs wait in PostgreSQL for a running slot, not in SQS (kairos.budgets, "Slots"). A queued run is
-- handed to SQS only once it holds one of its owner's slots (KAIROS_OWNER_CONCURRENCY) and, with a
-- concurrency key, one of its key's (a webhook's flow.concurrency); the others stay queued, unsent,
-- and are released oldest first by the statement that ends or parks the run holding a slot (the
-- trigger below) and by the tick's repair. Before, a claim that found the slots full re-sent the id
-- with a 30-60 s SQS delay, again and again (run.deferred, still an event type of older traces).
--
-- A run holds a slot while it is running, and while it is queued with admitted_at set (released, on
-- its way through SQS to a claim, or back in the queue for a retry, a rescue or a corpus slice);
-- approvals, questions, a corpus pause and every end give it up. The claim takes only an admitted
-- run, without any lock; a run nobody released (a stray message) is claimed only under its owner's
-- slot lock with room to spare, and otherwise left waiting for its release.

-- When the run was given its slot (NULL: it holds none; it waits when queued).
ALTER TABLE runs ADD COLUMN admitted_at timestamptz;
-- The run whose end (or parking) released this one: its worker sends the released ids after commit.
ALTER TABLE runs ADD COLUMN released_by uuid;
-- The owner's running slots when the run was queued (KAIROS_OWNER_CONCURRENCY at intake).
ALTER TABLE runs ADD COLUMN slot_limit integer NOT NULL DEFAULT 4 CHECK (slot_limit >= 1);
-- A webhook run's concurrency key (the value at flow.concurrency.key in its payload) and its limit:
-- at most concurrency_limit runs of the schedule hold a slot per key value.
ALTER TABLE runs ADD COLUMN concurrency_key text;
ALTER TABLE runs ADD COLUMN concurrency_limit integer CHECK (concurrency_limit >= 1);
ALTER TABLE runs ADD CONSTRAINT runs_concurrency_check CHECK (concurrency_key IS NULL OR concurrency_limit IS NOT NULL);

-- The owner's slot holders (never more than its slots, so a count reads a handful of entries) and
-- its waiting runs, oldest first (what a release reads).
CREATE INDEX runs_slot_holders_idx ON runs (owner) WHERE state = 'running' OR admitted_at IS NOT NULL;
CREATE INDEX runs_slot_waiting_idx ON runs (owner, created_at, id)
    WHERE state = 'queued' AND admitted_at IS NULL AND blocked_by_run_id IS NULL AND paused_at IS NULL;
CREATE INDEX runs_released_by_idx ON runs (released_by) WHERE released_by IS NOT NULL;

-- Admits the owner's oldest waiting runs into its free slots: each only while its concurrency key
-- (when it has one) has room too, a key's runs in their order. Takes the owner's slot lock first
-- and holds it to the end of the caller's transaction: a plpgsql function's every query takes a new
-- snapshot, so the counts below see every release and end committed by whoever held the lock
-- before — two releases never hand out one slot twice, and a run that ends while a new one is
-- recorded never leaves that one waiting beside a free slot. It only waits for that lock (the
-- update re-checks what it chose), so a caller takes it last, or several owners' in owner order.
-- The candidates are the owner's 100 oldest waiting runs: behind 100 runs whose keys are all full,
-- a run waits for one of them to go.
CREATE FUNCTION kairos_release_slots(p_owner text, p_released_by uuid, p_now timestamptz)
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
        RETURNING u.id
    )
    SELECT a.id FROM admitted a;
END;
$$;

-- A run that parks, pauses or ends gives its slot up: admitted_at is cleared with the move.
CREATE FUNCTION kairos_runs_give_up_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.admitted_at := NULL;
    RETURN NEW;
END;
$$;
CREATE TRIGGER runs_give_up_slot BEFORE UPDATE ON runs FOR EACH ROW
    WHEN (NEW.admitted_at IS NOT NULL AND (NEW.state NOT IN ('queued', 'running') OR NEW.paused_at IS NOT NULL))
    EXECUTE FUNCTION kairos_runs_give_up_slot();

-- ... and the same statement releases the oldest waiting run(s) its slot lets in (released_by = it).
CREATE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM kairos_release_slots(NEW.owner, NEW.id, NULL);
    RETURN NULL;
END;
$$;
CREATE TRIGGER runs_release_slot AFTER UPDATE ON runs FOR EACH ROW
    WHEN ((OLD.state = 'running' OR OLD.admitted_at IS NOT NULL)
          AND NOT (NEW.state = 'running' OR NEW.admitted_at IS NOT NULL))
    EXECUTE FUNCTION kairos_runs_release_slot();

-- What a queued run waits for, as its owner reads it (kairos.runs.Run.waiting_for): 'key' while its
-- concurrency key's runs fill the key's limit, else 'slot' while it holds no slot; NULL for any run
-- that waits for nothing of the kind (running, ended, released, queued behind another run, paused).
CREATE FUNCTION kairos_waiting_for(r runs) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN r.state <> 'queued' OR r.admitted_at IS NOT NULL OR r.blocked_by_run_id IS NOT NULL
             OR r.paused_at IS NOT NULL THEN NULL
        WHEN r.concurrency_key IS NOT NULL
             AND (SELECT count(*) FROM runs k
                   WHERE k.owner = r.owner AND (k.state = 'running' OR k.admitted_at IS NOT NULL)
                     AND k.schedule_id = r.schedule_id AND k.concurrency_key = r.concurrency_key)
                 >= r.concurrency_limit THEN 'key'
        ELSE 'slot'
    END
$$;
