-- OAuth for MCP servers (auth = "oauth" in config/mcp.toml). Per server: what discovery found and
-- the client Gatehouse uses, the tokens, and whether an owner must log in again. Token responses
-- and client secrets are stored only encrypted (XChaCha20-Poly1305 with the key in
-- GATEHOUSE_MCP_TOKEN_KEY; hex of nonce and ciphertext). Logins in flight (the PKCE verifier)
-- stay in the memory of the process that started them.
CREATE TABLE mcp_oauth (
    server_id      TEXT    PRIMARY KEY,
    -- The MCP server URL the tokens were issued for: a changed URL needs a new login.
    resource       TEXT    NOT NULL,
    -- Authorization server metadata as discovered (JSON).
    metadata       TEXT    NOT NULL,
    client_id      TEXT    NOT NULL,
    -- Encrypted: a client secret from dynamic registration.
    client_secret  TEXT,
    -- Encrypted: the token response with its scopes and time (JSON).
    credentials    TEXT,
    -- connected or needs_login.
    state          TEXT    NOT NULL,
    -- Why it needs a login (no secret in it), and the scope the server last asked for.
    reason         TEXT,
    required_scope TEXT,
    -- One process refreshes at a time: a compare-and-set lease.
    lease_token    TEXT,
    lease_until    BIGINT,
    -- Refreshes done (observability, and the tests' proof of one refresh).
    refreshes      BIGINT  NOT NULL DEFAULT 0,
    updated_at     BIGINT  NOT NULL
);

