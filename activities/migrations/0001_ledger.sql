-- Ledger schema v1: alerts, repairs and their stage transitions, escalation history,
-- idempotency keys, validation verdicts and hardware tickets.

CREATE TABLE alerts (
    alert_id      TEXT PRIMARY KEY,
    cluster       TEXT NOT NULL,
    node          TEXT NOT NULL,
    machine_id    TEXT,
    kind          TEXT NOT NULL,
    code          INTEGER,
    gpu           TEXT,
    severity      TEXT NOT NULL,
    mnemonic      TEXT NOT NULL DEFAULT '',
    actionable    BOOLEAN NOT NULL,
    action        TEXT NOT NULL,
    summary       TEXT NOT NULL,
    description   TEXT NOT NULL DEFAULT '',
    evidence_text TEXT NOT NULL DEFAULT '',
    evidence      JSONB NOT NULL DEFAULT '{}'::jsonb,
    level         BOOLEAN NOT NULL DEFAULT FALSE,
    active        BOOLEAN NOT NULL DEFAULT TRUE,
    source        TEXT NOT NULL,
    observed_at   TIMESTAMPTZ NOT NULL,
    recorded_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX alerts_node_idx ON alerts (cluster, node, observed_at DESC);
CREATE INDEX alerts_machine_idx ON alerts (machine_id, observed_at DESC);

-- Alerts of kinds with no action mapping, counted per kind (never dropped: the rows
-- stay in `alerts` too).
CREATE TABLE unmapped_alert_counts (
    kind   TEXT PRIMARY KEY,
    count  BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE repairs (
    repair_id       TEXT PRIMARY KEY,
    cluster         TEXT NOT NULL,
    node            TEXT NOT NULL,
    machine_id      TEXT,
    action          TEXT NOT NULL,
    stage           TEXT NOT NULL,
    requester_kind  TEXT NOT NULL,
    requester_name  TEXT NOT NULL,
    reason          TEXT NOT NULL DEFAULT '',
    approved_by     TEXT,
    decided_by_rule TEXT,
    detector        TEXT,
    request_id      TEXT,
    alert_ids       TEXT[] NOT NULL DEFAULT '{}',
    workflow_id     TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX repairs_node_idx ON repairs (cluster, node, created_at DESC);
CREATE INDEX repairs_stage_idx ON repairs (stage);

CREATE TABLE repair_transitions (
    id         BIGSERIAL PRIMARY KEY,
    repair_id  TEXT NOT NULL,
    stage      TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    by_whom    TEXT NOT NULL DEFAULT 'system',
    reason     TEXT NOT NULL DEFAULT '',
    UNIQUE (repair_id, stage, at)
);
CREATE INDEX repair_transitions_repair_idx ON repair_transitions (repair_id, at);

-- Escalation history: every executed action and its outcome (the ladder reads it).
CREATE TABLE repair_attempts (
    id          BIGSERIAL PRIMARY KEY,
    repair_id   TEXT NOT NULL,
    cluster     TEXT NOT NULL,
    node        TEXT NOT NULL,
    machine_id  TEXT,
    action      TEXT NOT NULL,
    alert_kind  TEXT NOT NULL,
    code        INTEGER,
    outcome     TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    UNIQUE (repair_id, action, at)
);
CREATE INDEX repair_attempts_machine_idx ON repair_attempts (cluster, machine_id, at DESC);
CREATE INDEX repair_attempts_node_idx ON repair_attempts (cluster, node, at DESC);

-- Detector + request id is the idempotency key across the cluster, forever (DESIGN §5).
CREATE TABLE idempotency_keys (
    detector    TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    repair_id   TEXT NOT NULL,
    cluster     TEXT NOT NULL,
    node        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (detector, request_id)
);

CREATE TABLE validation_verdicts (
    run_id   TEXT PRIMARY KEY,
    cluster  TEXT NOT NULL,
    machine  TEXT NOT NULL,
    verdict  TEXT NOT NULL CHECK (verdict IN ('passed', 'failed', 'aborted')),
    result   JSONB NOT NULL,
    at       TIMESTAMPTZ NOT NULL
);
CREATE INDEX validation_verdicts_machine_idx ON validation_verdicts (machine, at DESC);

CREATE TABLE hardware_tickets (
    ticket_id  TEXT PRIMARY KEY,
    cluster    TEXT NOT NULL,
    machine    TEXT NOT NULL,
    run_id     TEXT NOT NULL UNIQUE,
    summary    TEXT NOT NULL,
    result     JSONB NOT NULL,
    status     TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    opened_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    closed_at  TIMESTAMPTZ
);
CREATE INDEX hardware_tickets_machine_idx ON hardware_tickets (machine, status);
