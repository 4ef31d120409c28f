-- Conversation memory: every turn of every chat (no fixed cap), and the summary that older
-- turns are compacted into once a chat outgrows its token budget.
CREATE TABLE chat_turns (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id     TEXT    NOT NULL,
    channel     TEXT    NOT NULL,
    role        TEXT    NOT NULL,
    text        TEXT    NOT NULL,
    -- The inbound message a user turn holds, or the one an assistant turn answers.
    message_id  TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    tokens      INTEGER NOT NULL
);
CREATE UNIQUE INDEX chat_turns_message ON chat_turns(message_id, role);
CREATE INDEX chat_turns_chat ON chat_turns(chat_id, id);

CREATE TABLE chat_memory (
    chat_id         TEXT    PRIMARY KEY,
    summary         TEXT    NOT NULL,
    -- Turns up to this id are in the summary.
    covers_through  INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

-- One trace per processed message: every runtime step with its decision, reason and timing.
CREATE TABLE traces (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    correlation_id  TEXT    NOT NULL,
    channel         TEXT    NOT NULL,
    chat_id         TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    actor           TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    outcome         TEXT    NOT NULL,
    error_code      TEXT,
    started_at      INTEGER NOT NULL,
    duration_us     INTEGER NOT NULL
);
CREATE INDEX traces_started ON traces(started_at);
CREATE INDEX traces_chat ON traces(chat_id, id);

CREATE TABLE trace_steps (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id     INTEGER NOT NULL REFERENCES traces(id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL,
    step         TEXT    NOT NULL,
    decision     TEXT    NOT NULL,
    reason_code  TEXT    NOT NULL,
    duration_us  INTEGER NOT NULL,
    -- JSON facts: model, tokens, lengths; text only when conversation.trace_text is on.
    detail       TEXT    NOT NULL
);
CREATE INDEX trace_steps_trace ON trace_steps(trace_id, seq);

-- The runtime's answer to each message, kept so a retried job (say, the send failed) sends the
-- same reply again instead of asking the model twice; the delivery ledger then skips parts
-- already out.
CREATE TABLE message_replies (
    message_id  TEXT    PRIMARY KEY,
    route       TEXT    NOT NULL,
    reply       TEXT,
    trace_id    INTEGER NOT NULL,
    at          INTEGER NOT NULL
);
