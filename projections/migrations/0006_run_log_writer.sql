-- Who wrote each log chunk: any worker principal may write to run-logs, so a chunk is
-- shown only when its writer held the attempt (projections/queries.py), and the writer
-- is part of the key, so a forged chunk written first cannot take the real one's place.
-- Chunks projected before this migration have no writer ('') and stay visible.
ALTER TABLE run_logs ADD COLUMN IF NOT EXISTS worker_id text NOT NULL DEFAULT '';
ALTER TABLE run_logs DROP CONSTRAINT IF EXISTS run_logs_pkey;
ALTER TABLE run_logs ADD PRIMARY KEY (run_id, attempt, stream, seq, worker_id);
