-- Corpus runs: a schedule or chat turn may carry `corpus`; its run stays
-- the one authority (lease, fence, cancellation, trace, terminal state) and these child tables hold
-- the manifest, the partitions, the records and the export checkpoints. Every write of them is made
-- by the run's fence holder, in a transaction that has locked the run row under its fence.

ALTER TABLE schedules ADD COLUMN corpus jsonb;  -- part of the definition (schedule_revisions)

ALTER TABLE runs
    ADD COLUMN corpus             jsonb,        -- the checked corpus spec the run executes
    ADD COLUMN pause_requested_at timestamptz,  -- the owner asked to pause: the worker stops at a partition boundary
    ADD COLUMN paused_at          timestamptz;  -- paused (state queued, lease cleared): not claimed, not re-sent

-- One row per corpus run: its phase. Out of each phase by the fence holder only.
CREATE TABLE corpus_runs (
    run_id           uuid PRIMARY KEY REFERENCES runs (id),
    owner            text NOT NULL,
    phase            text NOT NULL DEFAULT 'enumerate'
                     CHECK (phase IN ('enumerate', 'map', 'reconcile', 'reduce', 'export', 'publish', 'complete')),
    items_total      integer NOT NULL DEFAULT 0 CHECK (items_total >= 0),
    partitions_total integer NOT NULL DEFAULT 0 CHECK (partitions_total >= 0),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);

-- The manifest: every item in stable order (ordinal), with its key, digest and size.
CREATE TABLE corpus_items (
    run_id    uuid NOT NULL REFERENCES corpus_runs (run_id),
    ordinal   integer NOT NULL CHECK (ordinal >= 0),
    key       text NOT NULL,
    digest    text NOT NULL,
    bytes     bigint NOT NULL CHECK (bytes >= 0),
    PRIMARY KEY (run_id, ordinal)
);

-- Partitions: a stable range of the manifest. `generation` is the repair generation (part of the
-- map call's input identity); `answer` is the checkpoint of the completed call of that generation.
CREATE TABLE corpus_partitions (
    run_id            uuid NOT NULL REFERENCES corpus_runs (run_id),
    n                 integer NOT NULL CHECK (n >= 0),
    first_ordinal     integer NOT NULL,
    last_ordinal      integer NOT NULL,  -- inclusive
    state             text NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    generation        integer NOT NULL DEFAULT 0 CHECK (generation BETWEEN 0 AND 2),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    answer            text,
    answer_generation integer,
    records           integer NOT NULL DEFAULT 0,
    error_code        text,
    updated_at        timestamptz NOT NULL,
    PRIMARY KEY (run_id, n),
    CONSTRAINT corpus_partitions_lease_iff_running CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CONSTRAINT corpus_partitions_answer_generation CHECK ((answer IS NULL) = (answer_generation IS NULL))
);

-- What each succeeded partition's answer said, line by line (reduce's input).
CREATE TABLE corpus_outputs (
    run_id     uuid NOT NULL,
    partition  integer NOT NULL,
    line       integer NOT NULL,
    kind       text NOT NULL,
    id         text NOT NULL,
    data       jsonb NOT NULL,
    PRIMARY KEY (run_id, partition, line),
    FOREIGN KEY (run_id, partition) REFERENCES corpus_partitions (run_id, n)
);

-- Canonical records, merged by (kind, id); lineage names the partitions and item ranges.
CREATE TABLE corpus_records (
    run_id   uuid NOT NULL REFERENCES corpus_runs (run_id),
    kind     text NOT NULL,
    id       text NOT NULL,
    data     jsonb NOT NULL,
    lineage  jsonb NOT NULL,
    PRIMARY KEY (run_id, kind, id)
);

-- Export checkpoints: one multipart upload per format, its parts done and the last key written.
CREATE TABLE corpus_exports (
    run_id     uuid NOT NULL REFERENCES corpus_runs (run_id),
    format     text NOT NULL CHECK (format IN ('jsonl', 'graphml')),
    bucket     text NOT NULL,
    key        text NOT NULL,
    upload_id  text,
    parts      jsonb NOT NULL DEFAULT '[]',
    last_kind  text,
    last_id    text,
    bytes      bigint NOT NULL DEFAULT 0,
    sha256     text,
    done       boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, format)
);
