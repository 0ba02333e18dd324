-- The claim of a run nobody released takes its owner's slot lock itself (kairos.budgets, "Slots"). It was
-- a statement of its own before the claim (runs_hold_owner_slots), sent with it in one trip, so that the
-- claim's snapshot — and its slot count — came after the lock: one statement more for every claim,
-- released runs' included (which take no lock). Now the claim calls this function only for a queued run
-- that holds no slot: it takes the lock (exclusively, as a release does: after every end in progress
-- committed, migration 0036) and then counts — a plpgsql function's query takes a new snapshot, after
-- the lock — the owner's slot holders and the run's concurrency key's, as the claim's own count did.
-- The claim's own snapshot predates the lock, so the function first reads the run again, after the lock:
-- taken meanwhile (by a copy of its message whose claim held the lock and committed), it answers false
-- and the claim passes the row by without waiting for its row lock — which that claimer's end may hold
-- while it waits for this lock (shared, migration 0036): a deadlock otherwise. Released meanwhile, it
-- answers true: the claim's re-check of the updated row lets it through as a released run.
CREATE FUNCTION kairos_claim_slot_free(p_run uuid, p_owner text, p_schedule_id uuid, p_key text,
                                       p_key_limit integer, p_owner_slots integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_admitted timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || p_owner, 0));
    SELECT r.state, r.admitted_at INTO v_state, v_admitted FROM runs r WHERE r.id = p_run;
    IF v_state IS DISTINCT FROM 'queued' THEN
        RETURN false;
    END IF;
    IF v_admitted IS NOT NULL THEN
        RETURN true;
    END IF;
    RETURN (SELECT count(*) FROM (SELECT 1 FROM runs o
                                   WHERE o.owner = p_owner AND (o.state = 'running' OR o.admitted_at IS NOT NULL)
                                   LIMIT p_owner_slots) AS held) < p_owner_slots
           AND (p_key IS NULL
                OR (SELECT count(*) FROM runs k
                     WHERE k.owner = p_owner AND (k.state = 'running' OR k.admitted_at IS NOT NULL)
                       AND k.schedule_id = p_schedule_id AND k.concurrency_key = p_key) < p_key_limit);
END;
$$;
