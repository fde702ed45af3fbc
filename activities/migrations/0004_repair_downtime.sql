-- Ledger schema v4: downtime and cost of each finished repair (computed from its stage
-- transitions when it ends, workflows.downtime), and which stage transitions were
-- already notified (so a retried activity or a second worker never notifies twice).

CREATE TABLE repair_downtime (
    repair_id                 TEXT PRIMARY KEY,
    cluster                   TEXT NOT NULL,
    node                      TEXT NOT NULL,
    machine_id                TEXT,
    action                    TEXT NOT NULL,
    fault_kind                TEXT NOT NULL,
    outcome                   TEXT NOT NULL,
    started_at                TIMESTAMPTZ NOT NULL,
    ended_at                  TIMESTAMPTZ NOT NULL,
    gpus                      INTEGER NOT NULL,
    cordoned_at               TIMESTAMPTZ,
    rejoined_at               TIMESTAMPTZ,
    duration_s                DOUBLE PRECISION NOT NULL,
    idle_wait_s               DOUBLE PRECISION NOT NULL,
    out_of_service_s          DOUBLE PRECISION NOT NULL,
    gpu_hours                 DOUBLE PRECISION NOT NULL,
    idle_wait_gpu_hours       DOUBLE PRECISION NOT NULL,
    out_of_service_gpu_hours  DOUBLE PRECISION NOT NULL,
    hourly_rate               DOUBLE PRECISION,
    cost                      DOUBLE PRECISION,
    currency                  TEXT NOT NULL,
    provider                  TEXT,
    region                    TEXT,
    gpu_type                  TEXT,
    recorded_at               TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX repair_downtime_ended_idx ON repair_downtime (ended_at DESC);
CREATE INDEX repair_downtime_cluster_idx ON repair_downtime (cluster, ended_at DESC);

ALTER TABLE repair_transitions ADD COLUMN notified_at TIMESTAMPTZ;
