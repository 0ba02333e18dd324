-- Keyset pages and a schedule's last run (Find; kairos.pages).
--
-- Every list is read newest first by (instant, id) below a cursor. Each index here is that order
-- behind the list's equality column, so a page is one index range scan that stops after limit + 1
-- entries, however many rows the owner (or the schedule) has: no sort, no OFFSET walk.
--
-- runs: by owner for GET /v1/runs, by schedule for GET /v1/runs?schedule_id= and for every
-- schedule's last_run (a LATERAL probe: the first entry of its schedule's range). 0002 dropped
-- runs_owner_idx because nothing read it; now a query does. A claim or a terminal update already
-- writes new index entries (its state change leaves the partial indexes' predicates), so these add
-- an entry to those updates; a heartbeat touches none of their columns and stays a HOT update.
CREATE INDEX runs_owner_created_idx ON runs (owner, created_at DESC, id DESC);
CREATE INDEX runs_schedule_created_idx ON runs (schedule_id, created_at DESC, id DESC);

-- occurrences: several sources may share a fire_at (a scheduled and a backfill or manual fire of
-- one instant), so the id joins the key.
DROP INDEX occurrences_schedule_idx;
CREATE INDEX occurrences_schedule_idx ON occurrences (schedule_id, fire_at DESC, id DESC);

-- conversations: a fork schedule makes one per run; the list pages through them.
DROP INDEX conversations_owner_idx;
CREATE INDEX conversations_owner_idx ON conversations (owner, created_at DESC, id DESC);
