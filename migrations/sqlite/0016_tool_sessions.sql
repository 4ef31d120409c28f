-- Tool sessions (seed 000 §11, §13): one row per request that ran a chain of tool calls, and
-- one row per step, with how it ended.
CREATE TABLE tool_sessions (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    channel         TEXT    NOT NULL,
    chat_id         TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    correlation_id  TEXT    NOT NULL,
    trace_id        INTEGER,
    -- running, answered, stopped (a step failed, was refused or went to the background)
    status          TEXT    NOT NULL,
    step_count      INTEGER  NOT NULL,
    created_at      INTEGER  NOT NULL,
    updated_at      INTEGER  NOT NULL
);
CREATE INDEX tool_sessions_chat ON tool_sessions(channel, chat_id, id);
CREATE TABLE tool_session_steps (
    session_id      INTEGER  NOT NULL REFERENCES tool_sessions(id) ON DELETE CASCADE,
    step_index      INTEGER  NOT NULL,
    tool            TEXT    NOT NULL,
    -- answered, failed, pending (its answer follows from its job), approval (waits for an owner)
    status          TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    depends_on      INTEGER,
    created_at      INTEGER  NOT NULL,
    PRIMARY KEY (session_id, step_index)
);
