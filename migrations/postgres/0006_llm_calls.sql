-- One row per language-model call: tokens, cost and outcome, under the correlation id of the
-- message that caused it. No message text and no keys.
CREATE TABLE llm_calls (
    id                  BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                  BIGINT  NOT NULL,
    provider            TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    purpose             TEXT    NOT NULL,
    correlation_id      TEXT    NOT NULL,
    input_tokens        BIGINT  NOT NULL,
    output_tokens       BIGINT  NOT NULL,
    cache_read_tokens   BIGINT  NOT NULL,
    cache_write_tokens  BIGINT  NOT NULL,
    cost_micro_usd      BIGINT,
    latency_ms          BIGINT  NOT NULL,
    outcome             TEXT    NOT NULL,
    stop_reason         TEXT,
    http_status         BIGINT,
    attempts            BIGINT  NOT NULL,
    request_id          TEXT
);
CREATE INDEX llm_calls_at ON llm_calls(at);
CREATE INDEX llm_calls_correlation ON llm_calls(correlation_id);
