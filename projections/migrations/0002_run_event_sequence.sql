-- A run's transitions are ordered by the ledger's sequence number (event ids are
-- "{run_id}#{seq}", seq one more per transition of the run), not by their times: those
-- are stamped by different machines, and a cancel stamped a second after a start by a
-- worker whose clock ran two seconds ahead used to leave the run `running` for ever.
-- The projector keeps a run's row at the transition with the highest seq.
--
-- The default 0 keeps rows written without a seq (by a projector of the previous
-- version) updatable by every later event.

ALTER TABLE run_transitions ADD COLUMN seq integer NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN seq integer NOT NULL DEFAULT 0;

UPDATE run_transitions
SET seq = substring(event_id FROM '#([0-9]+)$')::integer
WHERE event_id ~ '#[0-9]+$';

-- Existing rows: the summary of their highest-seq transition, exactly as the projector
-- would have written it; this also repairs rows the time guard left in an older state.
UPDATE runs r SET
    seq = t.seq,
    state = t.state,
    attempt = t.attempt,
    worker_id = COALESCE(t.worker_id, r.worker_id),
    started_at = CASE WHEN t.state = 'running' THEN t.at ELSE r.started_at END,
    finished_at = CASE WHEN t.state IN ('succeeded', 'failed', 'cancelled', 'skipped')
                       THEN t.at END,
    exit_code = COALESCE((t.detail ->> 'exit_code')::integer, r.exit_code),
    error = NULLIF(t.detail ->> 'reason', ''),
    updated_at = t.at
FROM (
    SELECT DISTINCT ON (run_id) run_id, seq, state, attempt, at, worker_id, detail
    FROM run_transitions
    ORDER BY run_id, seq DESC
) t
WHERE r.run_id = t.run_id
  AND (r.seq, r.state, r.attempt, r.updated_at) IS DISTINCT FROM (t.seq, t.state, t.attempt, t.at);
