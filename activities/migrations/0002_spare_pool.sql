-- Ledger schema v2: the hot-spare pool per cluster (DESIGN §5 migrate). Machines that pass
-- validation after a migrate join it; migrations draw from it first.

CREATE TABLE spare_machines (
    cluster    TEXT NOT NULL,
    machine    TEXT NOT NULL,
    run_id     TEXT,
    added_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, machine)
);
CREATE INDEX spare_machines_cluster_idx ON spare_machines (cluster, added_at);
