-- The repair's mode (RepairRecord.mode: 'enforce' or 'shadow', policy.mode of its cluster
-- or pool when it started). The notification of a shadow-mode repair's ending written by
-- the ledger side (rejected, cancelled, auto_resolved, ...) starts its subject with
-- 'shadow:' as the shadowed and the workflow's own (failed, timed_out) ones do: nothing
-- was done. Rows written before this column hold NULL (read as enforce).
ALTER TABLE repairs ADD COLUMN mode TEXT;
