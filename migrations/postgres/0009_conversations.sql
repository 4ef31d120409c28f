-- Conversation memory: every turn of every chat (no fixed cap), and the summary that older
-- turns are compacted into once a chat outgrows its token budget.
CREATE TABLE chat_turns (
    id          BIGSERIAL PRIMARY KEY,
    chat_id     TEXT    NOT NULL,
    channel     TEXT    NOT NULL,
    role        TEXT    NOT NULL,
    text        TEXT    NOT NULL,
    -- The inbound message a user turn holds, or the one an assistant turn answers.
    message_id  TEXT    NOT NULL,
    at          BIGINT NOT NULL,
    tokens      BIGINT NOT NULL
);
CREATE UNIQUE INDEX chat_turns_message ON chat_turns(message_id, role);
CREATE INDEX chat_turns_chat ON chat_turns(chat_id, id);

CREATE TABLE chat_memory (
    chat_id         TEXT    PRIMARY KEY,
    summary         TEXT    NOT NULL,
    -- Turns up to this id are in the summary.
    covers_through  BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

-- One trace per processed message: every runtime step with its decision, reason and timing.
CREATE TABLE traces (
    id              BIGSERIAL PRIMARY KEY,
    correlation_id  TEXT    NOT NULL,
    channel         TEXT    NOT NULL,
    chat_id         TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    actor           TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    outcome         TEXT    NOT NULL,
    error_code      TEXT,
    started_at      BIGINT NOT NULL,
    duration_us     BIGINT NOT NULL
);
CREATE INDEX traces_started ON traces(started_at);
CREATE INDEX traces_chat ON traces(chat_id, id);

CREATE TABLE trace_steps (
    id           BIGSERIAL PRIMARY KEY,
    trace_id     BIGINT NOT NULL REFERENCES traces(id) ON DELETE CASCADE,
    seq          BIGINT NOT NULL,
    step         TEXT    NOT NULL,
    decision     TEXT    NOT NULL,
    reason_code  TEXT    NOT NULL,
    duration_us  BIGINT NOT NULL,
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
    trace_id    BIGINT NOT NULL,
    at          BIGINT NOT NULL
);
