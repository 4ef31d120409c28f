-- Tool results too large to pass inline: kept whole here; callers get a summary and this id.
CREATE TABLE tool_results (
    id              TEXT    PRIMARY KEY,
    tool            TEXT    NOT NULL,
    correlation_id  TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    size_bytes      INTEGER NOT NULL,
    truncated       INTEGER NOT NULL,
    body            TEXT    NOT NULL
);
CREATE INDEX tool_results_created ON tool_results(created_at);
