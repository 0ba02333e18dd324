-- A run end looks for its owner's waiting runs through runs_slot_waiting_idx, not by reading every run
-- (kairos.budgets, "Slots"; the look of migrations 0036 and 0042, unchanged in what it decides).
--
-- The look was `IF EXISTS (SELECT 1 FROM runs w WHERE w.owner = ... AND w.state = 'queued' AND
-- w.admitted_at IS NULL AND ...)`. The planner takes those conditions to be independent: with many of
-- the owner's runs queued (each holding a slot, admitted_at set) and many ended (admitted_at NULL) when
-- `runs` was last analyzed, it expects a quarter of the owner's runs to be waiting, and an EXISTS stops
-- at the first row it finds, so a sequential scan looks cheaper to it than a probe of the partial index
-- — cheaper still while `runs` is being written and few of its pages are all-visible (an index-only
-- scan then expects a heap visit per entry). In fact none waits, and the scan reads every run of every
-- owner, at every end. With many owners the owner's share of the table makes the estimate small and the
-- index wins; with one busy owner it does not: measured with the run handler on one owner (8 processes,
-- bench/server_share.py), this look was a sequential scan of `runs` at nearly every end, 3.0 ms of the
-- end's 5.5 ms of server CPU a run (0.07 ms on 50 owners).
--
-- An EXISTS drops an ORDER BY and a LIMIT; a plain query keeps them. Asked for the oldest waiting run
-- (the order of runs_slot_waiting_idx, as kairos_admit_waiting asks), a sequential scan must read and
-- sort every candidate before its first row, and every other index that gives that order (the owner's
-- runs by creation) visits a superset of the partial index's entries: the partial index is the cheapest
-- plan whatever the estimate.
CREATE OR REPLACE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('kairos.owner_slots:' || NEW.owner, 0));
    PERFORM 1 FROM runs w
      WHERE w.owner = NEW.owner AND w.state = 'queued' AND w.admitted_at IS NULL
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
