-- Browsers an owner has signed in from (device cookies). A login from one of them is not held
-- back by failures from elsewhere, only by its own (see owners::login), so guessing an owner's
-- login name from many addresses cannot lock that owner out. Stored under the SHA-256 of the
-- cookie's token. A device is trusted while the owner's session epoch is the one it was
-- trusted under: a password reset ends its trust as it ends sessions.
CREATE TABLE owner_devices (
    digest         TEXT    PRIMARY KEY,
    owner_id       INTEGER NOT NULL REFERENCES owners(id) ON DELETE CASCADE,
    session_epoch  INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    last_used_at   INTEGER NOT NULL
);
CREATE INDEX owner_devices_owner ON owner_devices(owner_id, last_used_at);

-- The trusted device a login attempt came from, whose own failures decide its throttle.
ALTER TABLE owner_audit ADD COLUMN device TEXT;
CREATE INDEX owner_audit_device_at ON owner_audit(device, at) WHERE device IS NOT NULL;
