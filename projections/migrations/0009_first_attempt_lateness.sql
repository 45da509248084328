-- Start lateness is the first attempt's, as the audit measures it: a retry's start
-- (after its backoff) is not lateness. `first_started_at` is kept from the first
-- attempt's `running` event; rows projected before this migration fall back to
-- started_at (the latest attempt's start).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS first_started_at timestamptz;

CREATE OR REPLACE VIEW run_lateness AS
SELECT run_id, job_id, scheduled_at, COALESCE(first_started_at, started_at) AS started_at,
       extract(epoch FROM COALESCE(first_started_at, started_at) - scheduled_at)::double precision
           AS lateness_s
FROM runs
WHERE COALESCE(first_started_at, started_at) IS NOT NULL AND trigger <> 'manual';
