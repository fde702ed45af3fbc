-- Ledger schema v3: which machine runs each node identity, machine moves by repair
-- (migrate / remove) and machines taken out of service.

-- The machine under a node after a migrate; a node without a row runs on the machine
-- of its configuration (ClusterConfig.nodes[].machine).
CREATE TABLE node_bindings (
    cluster    TEXT NOT NULL,
    node       TEXT NOT NULL,
    machine    TEXT NOT NULL,
    repair_id  TEXT,
    bound_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, node)
);
-- One machine serves at most one node identity.
CREATE UNIQUE INDEX node_bindings_machine_uq ON node_bindings (cluster, machine);

-- One row per repair and kind: a retried migrate/remove finds its own work here.
CREATE TABLE machine_moves (
    repair_id    TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('migrate', 'remove')),
    cluster      TEXT NOT NULL,
    node         TEXT NOT NULL,
    old_machine  TEXT NOT NULL,
    new_machine  TEXT,
    ticket_id    TEXT,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (repair_id, kind)
);
CREATE INDEX machine_moves_machine_idx ON machine_moves (cluster, old_machine, at DESC);

-- Machines out of the pool (pulled for RMA): never drawn as spares, never re-seeded.
CREATE TABLE removed_machines (
    cluster     TEXT NOT NULL,
    machine     TEXT NOT NULL,
    repair_id   TEXT NOT NULL,
    ticket_id   TEXT,
    reason      TEXT NOT NULL DEFAULT '',
    removed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, machine)
);
