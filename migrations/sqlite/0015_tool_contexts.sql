-- The tool context store (seed 000 §11): what a chat's recent tool results said, so that a
-- follow-up ("what about Saturday?", "open the second one") has a referent. One row per
-- summarised result of a chat, bounded per chat and swept when it expires. No secrets, managed
-- fields or private-data results are stored.
CREATE TABLE tool_contexts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    channel     TEXT    NOT NULL,
    chat_id     TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    -- Canonical JSON of the call's arguments, without managed or secret fields.
    args        TEXT    NOT NULL,
    summary     TEXT    NOT NULL,
    -- A bounded, redacted preview of the result.
    preview     TEXT    NOT NULL,
    -- JSON arrays: the result's links; its citations ({title, url} of each listed item that
    -- has both); and its entities (titles, names, links) in result order.
    sources     TEXT    NOT NULL,
    citations   TEXT    NOT NULL,
    entities    TEXT    NOT NULL,
    -- The same result stored twice (a retried run) is one row.
    source_key  TEXT    NOT NULL UNIQUE,
    trace_id    INTEGER,
    created_at  INTEGER  NOT NULL,
    expires_at  INTEGER  NOT NULL
);
CREATE INDEX tool_contexts_chat ON tool_contexts(channel, chat_id, id);
CREATE INDEX tool_contexts_expiry ON tool_contexts(expires_at);
