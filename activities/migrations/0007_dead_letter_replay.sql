-- Ledger schema v7: an operator re-delivers dead letters (`autorepair dead-letters
-- replay`). replayed_at: when the node's workflow took the alert on replay (NULL: not
-- replayed, or dead-lettered again since); replay_outcome: the workflow's answer
-- (AlertDelivery.outcome, e.g. "recommended", "deduplicated"). Rows are kept, not
-- deleted: the table stays the record of what could not be delivered and when.
ALTER TABLE dead_letters ADD COLUMN replayed_at TIMESTAMPTZ;
ALTER TABLE dead_letters ADD COLUMN replay_outcome TEXT;
