-- Elicitation forwarded to the owners (elicitation = "owner" on a server in config/mcp.toml): a
-- server's `elicitation/create` during a call waits here until an owner answers in the console
-- (or with `gatehouse mcp answer`), or its time runs out. The process that holds the call
-- polls its row, so the call and the console may run in different processes.
CREATE TABLE mcp_elicitations (
    id           BIGSERIAL PRIMARY KEY,
    server_id    TEXT    NOT NULL,
    -- From the server, untrusted: shown as text, labelled as the server's, bounded.
    message      TEXT    NOT NULL,
    -- The requested schema (JSON): a flat object of string, number, integer, boolean and enum
    -- properties.
    schema       TEXT    NOT NULL,
    -- pending, accepted, declined, cancelled or expired. Only a pending row is answered, once.
    state        TEXT    NOT NULL,
    -- The accepted values (JSON), checked against the schema.
    content      TEXT,
    created_at   BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    answered_at  BIGINT,
    answered_by  BIGINT,
    -- When the waiting call took the answer (or gave up): it is sent to the server once.
    delivered_at BIGINT
);
CREATE INDEX mcp_elicitations_state ON mcp_elicitations (state, expires_at);
