-- Deliver (issue 12, steering runs): a schedule says which run endings it reports, and
-- where a signed webhook goes; the tick delivers each report from a durable outbox.
--
-- `schedules.notify` is the checked request field (kairos.schedules.request): {"on": [terminal run
-- states], "webhook"?: {"url", "secret"}}, the secret a reference, never a value. A constant default:
-- a catalog-only change, and every existing schedule reports every unhappy end to its inbox.
ALTER TABLE schedules ADD COLUMN notify jsonb NOT NULL
    DEFAULT '{"on": ["failed", "abandoned", "expired", "policy_blocked"]}';

-- The outbox of webhook deliveries: one row per run (the key is the run, so a run is reported at
-- most once whoever settles it), written by the settle step in the transaction that settles the run,
-- sent by the tick's deliver step (kairos.tick.deliver).
--
-- state: pending (moved out by the deliver step: delivered on a 2xx, gave_up on a permanent refusal
-- or when the next attempt would fall after created_at + 24 h), delivered and gave_up (final).
-- url and secret_ref are the schedule's at the run's end (a later edit does not redirect a report
-- already owed). last_status / last_error say why the last attempt failed: a status, a reason code
-- and a short message; never a body, a header or a secret.
CREATE TABLE notify_deliveries (
    run_id          uuid PRIMARY KEY REFERENCES runs (id),
    schedule_id     uuid NOT NULL REFERENCES schedules (id),
    owner           text NOT NULL CHECK (owner <> ''),
    url             text NOT NULL,
    secret_ref      text NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'gave_up')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     integer,
    last_error      text CHECK (length(last_error) <= 500),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CONSTRAINT notify_deliveries_finished_iff_final CHECK ((state <> 'pending') = (finished_at IS NOT NULL))
);
CREATE INDEX notify_deliveries_due_idx ON notify_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX notify_deliveries_schedule_idx ON notify_deliveries (schedule_id);
