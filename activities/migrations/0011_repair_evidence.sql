-- Ledger schema v11: evidence captured before a disruptive action (issue 31 item 3,
-- workflows.evidence): one row per repair, action and attempt (a retried activity finds
-- its row), and the evidence a hardware ticket of the machine carries.

CREATE TABLE repair_evidence (
    repair_id    TEXT NOT NULL,
    action       TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    cluster      TEXT NOT NULL,
    node         TEXT NOT NULL,
    machine      TEXT NOT NULL,
    -- workflows.evidence.NodeCapture / BmcCapture as JSON; NULL = not captured
    node_capture JSONB,
    bmc_capture  JSONB,
    notes        JSONB NOT NULL DEFAULT '[]'::jsonb,
    summary      TEXT NOT NULL,
    captured_at  TIMESTAMPTZ NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (repair_id, action, attempt)
);
CREATE INDEX repair_evidence_machine_idx ON repair_evidence (cluster, machine, captured_at DESC);

ALTER TABLE hardware_tickets ADD COLUMN evidence JSONB NOT NULL DEFAULT '[]'::jsonb;
