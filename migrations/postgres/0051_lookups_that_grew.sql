-- Lookups whose cost grew with the tables they read, which are kept for ever (traces, the
-- WhatsApp ledger, findings) or for `retention.finished_jobs_days` (finished jobs):
-- - a message's traces: `traces::begin` looks for a running one on every message handled, in
--   the write transaction, and a chat's page links each message to its newest trace;
-- - the Traces page filtered by outcome, newest first, such as the dashboard's failure links;
-- - the Jobs page filtered by a finished state, newest first (the query repeats this index's
--   condition, so that SQLite may use it);
-- - a job's ledger rows (a stopped or unhandled job's send), and a repair's cases' findings.
CREATE INDEX traces_message ON traces(message_id, id);
CREATE INDEX traces_outcome ON traces(outcome, id);
CREATE INDEX jobs_finished ON jobs(state, id) WHERE state IN ('completed', 'cancelled', 'discarded');
CREATE INDEX whatsapp_outbound_job ON whatsapp_outbound(job_id) WHERE job_id IS NOT NULL;
CREATE INDEX findings_case ON findings(case_id) WHERE case_id IS NOT NULL;
