-- Ledger schema v5: alerts that ingest (or a watcher) could not hand to their node's
-- workflow: refused by the workflow, over the size limit, or still failing after the
-- bounded retries (ingest.handoff_max_attempts). One row per alert id; a later failure of
-- the same alert updates it.
CREATE TABLE dead_letters (
    alert_id     TEXT PRIMARY KEY,
    cluster      TEXT NOT NULL,
    node         TEXT NOT NULL,
    kind         TEXT NOT NULL,
    reason       TEXT NOT NULL CHECK (reason IN ('rejected', 'too_large', 'retries_exhausted')),
    error        TEXT NOT NULL DEFAULT '',
    attempts     INTEGER NOT NULL DEFAULT 0,
    alert_bytes  INTEGER NOT NULL,
    -- the alert as JSON; over 256 KiB only its identity and summary are kept
    alert        JSONB NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_node_idx ON dead_letters (cluster, node, recorded_at DESC);
