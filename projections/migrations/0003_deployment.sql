-- Which deployment this database belongs to: the topic prefix (CRONLOG_TOPIC_PREFIX)
-- whose topics its projection holds. The projection tables carry no prefix, so two
-- deployments pointed at one database would mix their rows (and a rebuild would wait for
-- the other deployment's offsets). The first process of a deployment that migrates the
-- database records its prefix here (projections/deployment.py); every later one checks
-- it and refuses another deployment's database. One row at most.

CREATE TABLE deployment (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    topic_prefix  text NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now()
);
