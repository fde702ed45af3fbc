-- Machines an operator returned to service after a remove (issue 26 I18): a machine with a
-- succeeded `remove` attempt (or a row in removed_machines) is held for RMA until a return
-- newer than that removal is recorded here.
CREATE TABLE machine_returns (
    cluster      TEXT NOT NULL,
    machine      TEXT NOT NULL,
    returned_by  TEXT NOT NULL,
    reason       TEXT NOT NULL DEFAULT '',
    returned_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, machine, returned_at)
);
