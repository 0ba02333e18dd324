-- Run ends take their owner's slot lock SHARED again, as migration 0036 had them (kairos.budgets,
-- "Slots"; 0036's reasoning holds unchanged: every count that hands out or takes a slot — a release, a
-- fire that admits, the claim of a run nobody released — still takes the lock exclusively, so it waits
-- for every end in progress to commit; an end that finds the owner's runs waiting hands its slot out
-- under the ends' second lock, one such end at a time).
--
-- 0039 undid 0036 because the wait only moved: one owner's ends stopped queuing on the slot lock and
-- queued instead on the owner's single budget day row, which each run's settlement updates at the same
-- commit. With that row in stripes (0041) the wait has nowhere to move to. Measured with the run
-- handler on one owner (8 processes, the code with and without this migration in interleaved rounds on
-- one server, docs/benchmarks.md): one owner's runs/s rose in every round, and its terminal statement
-- (runs_publish) no longer waits for the previous end's commit.
CREATE OR REPLACE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('kairos.owner_slots:' || NEW.owner, 0));
    IF EXISTS (SELECT 1 FROM runs w
                WHERE w.owner = NEW.owner AND w.state = 'queued' AND w.admitted_at IS NULL
                  AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slot_ends:' || NEW.owner, 0));
        PERFORM kairos_admit_waiting(NEW.owner, NEW.id, NULL);
    END IF;
    RETURN NULL;
END;
$$;
