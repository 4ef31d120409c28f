-- Every tool call, allowed or denied, leaves one row: what was called (with the definition's
-- version hash), by whom, where, the decision and its reason code, and redacted arguments.
CREATE TABLE tool_audit (
    id              BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              BIGINT  NOT NULL,
    tool            TEXT    NOT NULL,
    version         TEXT,
    actor           TEXT    NOT NULL,
    chat_id         TEXT,
    chat_type       TEXT    NOT NULL,
    decision        TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    latency_us      BIGINT  NOT NULL,
    attempts        BIGINT  NOT NULL,
    correlation_id  TEXT    NOT NULL,
    args            TEXT    NOT NULL
);
CREATE INDEX tool_audit_tool_at ON tool_audit(tool, id);
CREATE INDEX tool_audit_correlation ON tool_audit(correlation_id);
