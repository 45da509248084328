-- Owner fairness (issue 53 item 12): the runs a job's queued backfills have still to
-- create, as the ledger keeps them in its state (JobState.backfill_queue), estimated
-- from the schedule's period (projections/backlog.py). The API's per-owner quota of
-- backfill runs sums it; 0 for rows projected before this migration.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS backfill_pending bigint NOT NULL DEFAULT 0;
