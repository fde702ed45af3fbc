-- The node pool the repair asked the cluster guard with (RepairRecord.node_pool: the
-- configuration's pool of the node, else the pool its alerts reported). A guard rebuilt
-- from the ledger re-registers each holder in it (ledger_guard_state), so one repair per
-- pool holds across a guard restart for a node the configuration places in no pool: the
-- rebuilt holder had no pool and a second repair of its pool was granted beside it. Rows
-- written before this column hold NULL (the configuration's pool, as before).
ALTER TABLE repairs ADD COLUMN node_pool TEXT;
