-- Planned maintenance windows (issue 29 item 1): operator windows; Slurm MAINT
-- reservations and the Kubernetes annotation are read from the schedulers, not stored.
CREATE TABLE maintenance_windows (
    window_id   TEXT PRIMARY KEY,
    cluster     TEXT NOT NULL,
    scope       TEXT NOT NULL CHECK (scope IN ('all', 'pool', 'nodes')),
    pool        TEXT,
    nodes       TEXT[] NOT NULL DEFAULT '{}',
    reason      TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    source      TEXT NOT NULL DEFAULT 'operator',
    starts_at   TIMESTAMPTZ NOT NULL,
    ends_at     TIMESTAMPTZ NOT NULL,
    ended_at    TIMESTAMPTZ,
    ended_by    TEXT
);
CREATE INDEX maintenance_windows_cluster_idx ON maintenance_windows (cluster, ends_at DESC);
