-- When the control plane received an alert (ingest's clock, Alert.received_at), kept
-- beside the sender's observed_at. I17: every window that judges alerts (the migrate
-- gate's critical history among them) is judged on it; observed_at is evidence only.
-- Rows recorded before this column existed (or alerts that never passed ingest: an
-- operator's, a guard's) have NULL and are judged on observed_at.
ALTER TABLE alerts ADD COLUMN received_at TIMESTAMPTZ;
