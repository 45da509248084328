-- One definition of a percentile everywhere (streams/core/percentile.py): the nearest
-- rank, a value that was measured, which is PostgreSQL's percentile_disc (the view had
-- percentile_cont, an interpolation, unlike the audit and the benchmarks).
CREATE OR REPLACE VIEW job_lateness AS
SELECT job_id,
       count(*) AS runs,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY lateness_s) AS p50_s,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY lateness_s) AS p99_s,
       max(lateness_s) AS max_s
FROM run_lateness
GROUP BY job_id;
