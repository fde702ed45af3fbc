-- Ledger schema v6: the ingest's durable hand-off (outbox). Ingest records each alert it
-- accepts here *before* it answers the push, so an alert is never acknowledged without
-- being stored; the row's hand-off state says whether the node's workflow has it yet.
--
-- handed_off_at: NULL while the alert waits for its NodeWorkflow (or the cluster guard);
-- set when the workflow's update completed or the alert was dead-lettered. Rows written
-- by any other path (the workflows' ledger_record_alert, the repair API, the watchers)
-- take the default: they are handled when written. Existing rows count as handed off.
ALTER TABLE alerts ADD COLUMN handed_off_at TIMESTAMPTZ DEFAULT now();
-- Position of the alert within the push that carried it: with recorded_at (one value per
-- transaction) it gives the order ingest accepted a node's alerts in, which re-delivery
-- after a restart keeps (a raise is never overtaken by its clear).
ALTER TABLE alerts ADD COLUMN accepted_ord INTEGER NOT NULL DEFAULT 0;
-- The node pool the agent reported (Alert.node_pool), needed to re-deliver the alert as it
-- was accepted; NULL when none was reported.
ALTER TABLE alerts ADD COLUMN node_pool TEXT;
CREATE INDEX alerts_handoff_pending_idx ON alerts (recorded_at, accepted_ord)
    WHERE handed_off_at IS NULL;
