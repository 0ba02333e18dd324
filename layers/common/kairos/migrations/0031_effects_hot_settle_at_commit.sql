-- The run path's effect rows and the owner's day row, cheaper (kairos.effects, kairos.budgets):
--
-- * An effect's close is a HOT update: its run index no longer carries `state` (the column every close
--   changes), so closing an effect writes no index entry. Every reader of the index names run_id, and a
--   run has a handful of effects, so filtering them by state is as fast; the table keeps room on its
--   pages (fillfactor 90) for the closed version to land beside the reserved one.
-- * The settlement of a reservation (kairos_settle_usage, migrations 0011 and 0022) runs at the commit
--   of the transaction that closed the effect, not at the close itself: the owner's day row in
--   usage_ledger is locked from the settlement to the commit, so deferring it to the commit shortens
--   that lock by whatever the transaction does after the close (a worker's end of run: its state
--   change, events and slot release). Concurrent runs of one owner queue on that row for less time.
--   A close and its settlement stay in one transaction (a constraint trigger fires before the
--   commit record), so no closing path can forget to give a reservation back.

DROP INDEX effects_run_idx;
CREATE INDEX effects_run_idx ON effects (run_id);
ALTER TABLE effects SET (fillfactor = 90);

DROP TRIGGER effects_settle_usage ON effects;
CREATE CONSTRAINT TRIGGER effects_settle_usage AFTER UPDATE OF state ON effects
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.state = 'reserved' AND NEW.state <> 'reserved')
    EXECUTE FUNCTION kairos_settle_usage();
