-- The dependency cycle a job's last change closed, the job first and last: the ledger
-- refused that change (its upstreams are out of effect until the job is changed again).
-- Empty for every job that closes none, and for rows projected before this migration.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cycle text[] NOT NULL DEFAULT '{}';
