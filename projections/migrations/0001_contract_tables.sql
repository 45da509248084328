-- The projection tables of the public contract (design.md section 2), read by users in
-- SQL. The projector (issue 5) fills them from the topics; they can always be rebuilt by
-- replay, so nothing here is the source of truth.

CREATE TABLE jobs (
    job_id       text PRIMARY KEY,
    owner        text NOT NULL,
    spec         jsonb NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    deleted      boolean NOT NULL DEFAULT false,
    next_due_at  timestamptz,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX jobs_owner_idx ON jobs (owner);
CREATE INDEX jobs_next_due_idx ON jobs (next_due_at) WHERE NOT deleted AND NOT paused;

CREATE TABLE runs (
    run_id        text PRIMARY KEY,
    job_id        text NOT NULL,
    scheduled_at  timestamptz NOT NULL,
    trigger       text NOT NULL
                  CHECK (trigger IN ('schedule', 'backfill', 'manual', 'dependency')),
    state         text NOT NULL
                  CHECK (state IN ('waiting', 'due', 'dispatched', 'running', 'retrying',
                                   'succeeded', 'failed', 'cancelled', 'skipped')),
    attempt       integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    worker_id     text,
    created_at    timestamptz NOT NULL,
    started_at    timestamptz,
    finished_at   timestamptz,
    exit_code     integer,
    error         text,
    updated_at    timestamptz NOT NULL
);
-- One run per (job, scheduled time): manual runs carry their request time and are
-- exempt, every other trigger is a firing of the schedule.
CREATE UNIQUE INDEX runs_job_scheduled_uq ON runs (job_id, scheduled_at)
    WHERE trigger <> 'manual';
CREATE INDEX runs_job_time_idx ON runs (job_id, scheduled_at DESC);
CREATE INDEX runs_live_idx ON runs (state)
    WHERE state IN ('waiting', 'due', 'dispatched', 'running', 'retrying');

CREATE TABLE run_transitions (
    event_id   text PRIMARY KEY,  -- the ledger's deterministic event id: replays dedup
    run_id     text NOT NULL,
    attempt    integer NOT NULL,
    state      text NOT NULL,
    at         timestamptz NOT NULL,
    worker_id  text,
    detail     jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX run_transitions_run_idx ON run_transitions (run_id, at);

CREATE TABLE workers (
    worker_id          text PRIMARY KEY,
    capacity           jsonb NOT NULL,
    free               jsonb NOT NULL,
    labels             jsonb NOT NULL DEFAULT '{}'::jsonb,
    last_heartbeat_at  timestamptz NOT NULL,
    state              text NOT NULL CHECK (state IN ('alive', 'suspected', 'dead'))
);

CREATE TABLE run_logs (
    run_id   text NOT NULL,
    attempt  integer NOT NULL,
    seq      bigint NOT NULL,
    stream   text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    data     text NOT NULL,
    at       timestamptz NOT NULL,
    PRIMARY KEY (run_id, attempt, stream, seq)
);

-- Exactly-once into PostgreSQL: the projector stores the next offset to read per
-- partition in the same transaction as the rows it derived from the records before it.
CREATE TABLE projector_offsets (
    topic        text NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint NOT NULL,
    PRIMARY KEY (topic, partition)
);

-- Undecodable records land here instead of stopping the projector.
CREATE TABLE projector_dead_letters (
    topic      text NOT NULL,
    partition  integer NOT NULL,
    "offset"   bigint NOT NULL,
    reason     text NOT NULL,
    payload    bytea,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);

-- Start lateness: how late each run started against its scheduled time.
CREATE VIEW run_lateness AS
SELECT run_id, job_id, scheduled_at, started_at,
       extract(epoch FROM started_at - scheduled_at)::double precision AS lateness_s
FROM runs
WHERE started_at IS NOT NULL AND trigger <> 'manual';

CREATE VIEW job_lateness AS
SELECT job_id,
       count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_s) AS p50_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_s) AS p99_s,
       max(lateness_s) AS max_s
FROM run_lateness
GROUP BY job_id;
