-- Whether a person is asked for an approval now (RepairRecord.approval_pending). A
-- repair approved before its cordon keeps the stage awaiting_approval (the documented
-- stage order, docs/design.md §4.4) while it waits for its lease or a maintenance
-- window: false then, so its state reads in_progress (RepairView.state, the API's
-- state=awaiting_approval filter) and no second approval_needed notification goes out.
-- Rows written before this column hold NULL and are judged by their stage.
ALTER TABLE repairs ADD COLUMN approval_pending BOOLEAN;
