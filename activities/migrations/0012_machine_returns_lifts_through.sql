-- A return lifts the holds it saw: the newest removal at the time of the return. Judged
-- on that removal's own time, not the ledger clock of the return, so a removal recorded
-- with the control plane's clock is lifted exactly, and a later removal holds again.
ALTER TABLE machine_returns ADD COLUMN lifts_through TIMESTAMPTZ;
