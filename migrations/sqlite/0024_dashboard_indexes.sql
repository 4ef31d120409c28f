-- The dashboard's charts read the last day: job waits by when the jobs started, tool calls by
-- when they were made.
CREATE INDEX jobs_started ON jobs(started_at) WHERE started_at IS NOT NULL;
CREATE INDEX tool_audit_at ON tool_audit(at);
