-- A run's usage counting one effect as settled with the usage given: what kairos_run_usage (migration
-- 0022) answers once that effect has settled, for the statement that settles it and ends the run at once
-- (runs_publish): a statement does not see its own writes, so kairos_run_usage in it would still read the
-- effect reserved and leave its call out.
CREATE FUNCTION kairos_run_usage_with(run uuid, settling uuid, settling_usage jsonb) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_object_agg(s.key, s.total)
      FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
              FROM (SELECT e.usage FROM effects e
                     WHERE e.run_id = run AND e.state = 'settled' AND e.id <> settling
                    UNION ALL
                    SELECT settling_usage) AS x (usage)
             CROSS JOIN LATERAL jsonb_each(x.usage) AS u(key, value)
             WHERE jsonb_typeof(x.usage) = 'object' AND jsonb_typeof(u.value) = 'number'
             GROUP BY u.key) AS s
$$;
