-- MCP servers and the tools they list: the discovery cache (Gatehouse starts with the last known
-- tools when a server is down), quarantine state with the previous definition for the owner's
-- diff, and each server's health. Booleans are integers 0/1 on both backends.
CREATE TABLE mcp_servers (
    id               TEXT    PRIMARY KEY,
    -- The owner's choice from the console; NULL follows config/mcp.toml.
    enabled_override INTEGER,
    -- connected, degraded or down.
    health           TEXT    NOT NULL,
    last_error       TEXT,
    last_seen_at     INTEGER,
    tool_count       INTEGER NOT NULL DEFAULT 0,
    -- Set by the first successful discovery.
    discovered_at    INTEGER,
    updated_at       INTEGER NOT NULL
);

CREATE TABLE mcp_tools (
    server_id            TEXT    NOT NULL REFERENCES mcp_servers(id) ON DELETE CASCADE,
    -- The tool's name on the server, and in the catalog.
    name                 TEXT    NOT NULL,
    catalog_name         TEXT    NOT NULL,
    -- The bounded definition as discovered (JSON) and its sha256.
    definition           TEXT    NOT NULL,
    definition_hash      TEXT    NOT NULL,
    -- pending, approved or rejected.
    state                TEXT    NOT NULL,
    -- The hash an owner (or trust) last approved.
    approved_hash        TEXT,
    -- The definition before the last change, for the diff.
    previous_definition  TEXT,
    -- 1 while the server still lists it.
    present              INTEGER NOT NULL,
    first_seen_at        INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    decided_at           INTEGER,
    decided_by           INTEGER,
    PRIMARY KEY (server_id, name)
);
CREATE UNIQUE INDEX mcp_tools_catalog_name ON mcp_tools(catalog_name);
CREATE INDEX mcp_tools_state ON mcp_tools(state);
