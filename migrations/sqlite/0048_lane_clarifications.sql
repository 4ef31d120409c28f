-- A clarifying question the tool lane asked: the request it was about, each question and each
-- answer so far, and the tools it was about. The asked person's next message to the assistant is
-- planned as its answer (to their newest open question), with the request, instead of alone. One
-- row per question: a message asks at most one. Swept like tool contexts.
CREATE TABLE lane_clarifications (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    channel     TEXT    NOT NULL,
    chat_id     TEXT    NOT NULL,
    requester   TEXT    NOT NULL,
    -- JSON array of {who, text}, oldest first: the request, then each question and answer.
    turns       TEXT    NOT NULL,
    -- JSON array: the names of the tools the question was about.
    tools       TEXT    NOT NULL,
    -- The message whose handling asked, and the one that answered (none yet: pending). A
    -- message handled again after a crash takes the question it answered the first time.
    asked_by    TEXT    NOT NULL,
    answered_by TEXT,
    trace_id    INTEGER,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX lane_clarifications_asked ON lane_clarifications(channel, asked_by);
CREATE INDEX lane_clarifications_person ON lane_clarifications(channel, chat_id, requester, id);
CREATE INDEX lane_clarifications_expiry ON lane_clarifications(expires_at);

-- An eval case made from an answer replays with the question it answered (JSON, as above).
ALTER TABLE eval_cases ADD COLUMN clarification TEXT;
