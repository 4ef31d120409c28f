-- One row per language-model call: tokens, cost and outcome, under the correlation id of the
-- message that caused it. No message text and no keys.
CREATE TABLE llm_calls (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    at                  INTEGER NOT NULL,
    provider            TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    purpose             TEXT    NOT NULL,
    correlation_id      TEXT    NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    cost_micro_usd      INTEGER,
    latency_ms          INTEGER NOT NULL,
    outcome             TEXT    NOT NULL,
    stop_reason         TEXT,
    http_status         INTEGER,
    attempts            INTEGER NOT NULL,
    request_id          TEXT
);
CREATE INDEX llm_calls_at ON llm_calls(at);
CREATE INDEX llm_calls_correlation ON llm_calls(correlation_id);
