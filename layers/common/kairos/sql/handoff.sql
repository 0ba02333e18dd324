-- name: runs_stamp_handoff
-- Records that SQS accepted these run ids (any state: a fast worker may have claimed one already).
UPDATE runs
   SET handoff_at = coalesce(%(now)s::timestamptz, now()),
       handoff_count = handoff_count + 1
 WHERE id = ANY(%(ids)s::uuid[]);
