-- Owners, their WhatsApp numbers, the one-time setup marker, the owner audit trail and sessions.
-- Timestamps are unix milliseconds; JSON is TEXT.

CREATE TABLE owners (
    id             BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    login          TEXT    NOT NULL UNIQUE,
    display_name   TEXT    NOT NULL,
    password_hash  TEXT    NOT NULL,
    -- Bumped on password reset; sessions carrying an older epoch are void.
    session_epoch  BIGINT  NOT NULL DEFAULT 0,
    created_at     BIGINT  NOT NULL,
    updated_at     BIGINT  NOT NULL
);

CREATE TABLE owner_phones (
    phone       TEXT    PRIMARY KEY,
    owner_id    BIGINT  NOT NULL REFERENCES owners(id) ON DELETE CASCADE,
    created_at  BIGINT  NOT NULL
);
CREATE INDEX owner_phones_owner ON owner_phones(owner_id);

-- A single row, written in the same transaction as the first owner. Its primary key makes a
-- second concurrent setup fail, and it stays even if owners are later removed.
CREATE TABLE setup_state (
    id            BIGINT  PRIMARY KEY CHECK (id = 1),
    completed_at  BIGINT  NOT NULL,
    owner_id      BIGINT  NOT NULL
);

CREATE TABLE owner_audit (
    id        BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        BIGINT  NOT NULL,
    owner_id  BIGINT,
    login     TEXT,
    ip        TEXT,
    event     TEXT    NOT NULL,
    detail    TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX owner_audit_login_at ON owner_audit(event, login, at);
CREATE INDEX owner_audit_ip_at ON owner_audit(event, ip, at);
CREATE INDEX owner_audit_at ON owner_audit(at);

CREATE TABLE sessions (
    id          TEXT    PRIMARY KEY,
    data        TEXT    NOT NULL,
    expires_at  BIGINT  NOT NULL
);
CREATE INDEX sessions_expires ON sessions(expires_at);
