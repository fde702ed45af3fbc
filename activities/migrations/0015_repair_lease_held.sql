-- Whether the repair holds a lease the cluster guard granted, recorded by the holder
-- (RepairRecord.lease_held: set when the grant arrives, cleared when it hands the lease
-- back). A guard rebuilt from the ledger counts such a repair as a holder whatever its
-- stage: one granted before its cordon (before, the rebuilt guard missed it and granted
-- its slot again, exceeding the budget), or waiting for a person after it acted. One
-- that handed the lease back (a stale cordon a person must look at) is not counted.
-- Rows written before this column hold false and are judged by their stage.
ALTER TABLE repairs ADD COLUMN lease_held BOOLEAN NOT NULL DEFAULT false;
