-- A tool call's audit row names the trace of the message it was made for, so a trace shows its
-- tool calls. Calls from the console or the CLI have none.
ALTER TABLE tool_audit ADD COLUMN trace_id INTEGER;
CREATE INDEX tool_audit_trace ON tool_audit(trace_id);
