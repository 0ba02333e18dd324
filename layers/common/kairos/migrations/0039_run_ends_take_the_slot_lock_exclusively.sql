-- Run ends take their owner's slot lock exclusively again, as before migration 0036 (kairos.budgets,
-- "Slots"). Measured on the run handler (8 processes, one owner, old and new code in interleaved rounds on
-- one server): with ends sharing the lock, one owner's ends no longer waited for each other at the
-- terminal update (its mean 9.3 ms -> 1.4 ms), but the wait moved to the owner's day row of the budget
-- ledger, which every model call's settlement updates at commit, and runs per second did not rise, while
-- the server's CPU per run rose by about a fifth (in every round) — the ends queued on a row lock instead
-- of an advisory lock. kairos_admit_waiting (0036) stays: kairos_release_slots is the lock and it.
CREATE OR REPLACE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM kairos_release_slots(NEW.owner, NEW.id, NULL);
    RETURN NULL;
END;
$$;
