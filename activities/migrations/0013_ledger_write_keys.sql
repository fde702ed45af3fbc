-- A ledger write's own key, for the writes a workflow makes from a local activity
-- (attempts and stage transitions): "<run id>/<n>", n counting the run's such writes.
-- A workflow task cut short by a worker crash is run again with a later workflow clock,
-- and its local activities with it: keyed on (repair, action/stage, time) alone, the
-- write of the lost task and the write of the task that was kept made two rows (a
-- duplicated attempt climbs the ladder and fills the node cap). The key is the same in
-- both runs of the task, so the second overwrites the first. Rows written without a key
-- (older workers, the node workflow's closing transition) keep the old uniqueness.
ALTER TABLE repair_attempts ADD COLUMN write_key TEXT;
CREATE UNIQUE INDEX repair_attempts_write_key ON repair_attempts (write_key);
ALTER TABLE repair_transitions ADD COLUMN write_key TEXT;
CREATE UNIQUE INDEX repair_transitions_write_key ON repair_transitions (write_key);
