-- Bounded history (projections/retention.py). Runs are pruned through the existing
-- runs_job_time_idx (job, scheduled time) and their transitions and logs through their
-- run_id-leading keys; log chunks also age out on their own time (the run-logs topic
-- keeps only days of them, and the table keeps what a rebuild can restore), which needs
-- an index on that time to delete in small batches without scanning the table.
CREATE INDEX IF NOT EXISTS run_logs_at_idx ON run_logs (at);
