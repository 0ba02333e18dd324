-- name: runs_stamp_handoff
-- Records that SQS accepted these run ids (any state: a fast worker may have claimed one already).
-- unclaimed_handoffs counts the sends since the last claim (the claim resets it); a send a fast
-- worker claimed before this stamp does not count.
UPDATE runs
   SET handoff_at = coalesce(%(now)s::timestamptz, now()),
       handoff_count = handoff_count + 1,
       unclaimed_handoffs = unclaimed_handoffs + CASE WHEN state = 'queued' THEN 1 ELSE 0 END
 WHERE id = ANY(%(ids)s::uuid[]);
