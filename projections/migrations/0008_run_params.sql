-- The parameter values a run runs with (its first event carries them): a JSON object of
-- name: value, NULL for a run of a job that declares no parameters (and for rows
-- projected before this migration).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS params jsonb;
