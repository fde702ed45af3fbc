-- Alerts listed and windowed by when the control plane received them (I17): the API's
-- and the MCP tools' list_alerts order and `since` filter, the fleet summary's counts and
-- explain_recommendation's count-in-window use coalesce(received_at, observed_at), the
-- clock the NodeWorkflow counts on (observed_at only for rows without a receipt time:
-- recorded before 0014, or never passed through ingest). Built without CONCURRENTLY
-- (migrations run in one transaction): writes to alerts wait while it builds.
CREATE INDEX alerts_node_received_idx
    ON alerts (cluster, node, (coalesce(received_at, observed_at)) DESC);
CREATE INDEX alerts_received_idx ON alerts ((coalesce(received_at, observed_at)) DESC);
