-- Notices for owners raised by notify_owner tool hooks: shown in the console, and delivered on
-- WhatsApp by the channel once it is configured (delivered_at marks that).
CREATE TABLE owner_notifications (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              INTEGER NOT NULL,
    hook            TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    message         TEXT    NOT NULL,
    correlation_id  TEXT    NOT NULL,
    delivered_at    INTEGER
);
CREATE INDEX owner_notifications_at ON owner_notifications(at);
