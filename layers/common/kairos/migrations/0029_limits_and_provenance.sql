-- Limits you can act on, and what produced an answer (docs/api.md "Limits" and "Runs").
--
-- schedules.limits: what each run of the schedule may use and a webhook schedule's delivery rate
-- ({"runtime_seconds", "max_attempts", "max_steps", "rate_per_minute"}, each optional; NULL: none set,
-- so the agent's or the defaults apply; kairos.limits). A column of the definition: every revision
-- keeps its limits (kairos_schedule_definition is the row less its state columns).
ALTER TABLE schedules ADD COLUMN limits jsonb CHECK (limits IS NULL OR jsonb_typeof(limits) = 'object');

-- runs.max_steps: the tool loop's model turns this run may use, written when the run is recorded (as
-- runtime_limit_seconds and max_attempts are). Runs recorded before keep the old default.
ALTER TABLE runs ADD COLUMN max_steps integer NOT NULL DEFAULT 8 CHECK (max_steps >= 1);

-- What produced a run's answer: the schedule revision it executed (NULL for a chat turn, which has no
-- schedule) and the SHA-256 hex of its agent JSON in canonical form (kairos_agent_digest). Runs
-- recorded before this migration have neither.
ALTER TABLE runs ADD COLUMN schedule_revision integer CHECK (schedule_revision IS NULL OR schedule_revision >= 1);
ALTER TABLE runs ADD COLUMN agent_digest text CHECK (agent_digest IS NULL OR agent_digest ~ '^[0-9a-f]{64}$');

-- A JSON value as canonical text: object keys sorted by code point, no whitespace, strings as jsonb
-- writes them (UTF-8, the same escapes as Python's json.dumps with ensure_ascii=False), so
--   json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
-- gives the same text for an agent JSON (kairos.runs.agent_digest computes the digest that way).
CREATE FUNCTION kairos_canonical_json(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    CASE jsonb_typeof(value)
    WHEN 'object' THEN
        RETURN '{' || coalesce((SELECT string_agg(to_jsonb(e.key)::text || ':' || kairos_canonical_json(e.value), ','
                                                  ORDER BY e.key COLLATE "C")
                                  FROM jsonb_each(value) AS e), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((SELECT string_agg(kairos_canonical_json(a.value), ',' ORDER BY a.ordinal)
                                  FROM jsonb_array_elements(value) WITH ORDINALITY AS a(value, ordinal)), '') || ']';
    ELSE
        RETURN value::text;
    END CASE;
END
$$;

-- The agent digest of a run: SHA-256 hex of the agent JSON's canonical text. The agent JSON holds
-- secret references (env:NAME, an ARN), never values, so the digest never depends on a secret.
CREATE FUNCTION kairos_agent_digest(agent jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to(kairos_canonical_json(agent), 'UTF8')), 'hex')
$$;
