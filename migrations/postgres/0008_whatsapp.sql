-- The WhatsApp channel: inbound messages (stored before the webhook answers 200, unique on
-- Meta's wamid so a redelivery is recognised), the delivery ledger of outbound messages, and
-- notices sent at most once per chat per period.

CREATE TABLE whatsapp_inbound (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    wamid            TEXT    NOT NULL UNIQUE,
    phone_number_id  TEXT    NOT NULL,
    -- The group id for group messages, else the sender.
    chat_id          TEXT    NOT NULL,
    sender           TEXT    NOT NULL,
    is_group         BIGINT  NOT NULL,
    msg_type         TEXT    NOT NULL,
    text             TEXT,
    -- Interactive/button replies: the id or payload the button carries.
    reply_id         TEXT,
    -- The wamid this message quotes or answers (context.id).
    context_id       TEXT,
    -- The message object as Meta sent it, when it fits the configured bound.
    raw              TEXT,
    raw_truncated    BIGINT  NOT NULL,
    sent_at          BIGINT  NOT NULL,
    received_at      BIGINT  NOT NULL,
    -- Its job is found by jobs.message_id = wamid (and the dedupe key whatsapp.inbound:<wamid>).
    processed_at     BIGINT,
    outcome          TEXT
);
CREATE INDEX whatsapp_inbound_chat ON whatsapp_inbound(chat_id, id);

-- Every outbound message. The idempotency key (job id and part) is reserved before the send,
-- so a retried job finds what an earlier attempt already sent.
CREATE TABLE whatsapp_outbound (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key  TEXT    NOT NULL UNIQUE,
    job_id           BIGINT,
    part             BIGINT  NOT NULL,
    recipient        TEXT    NOT NULL,
    is_group         BIGINT  NOT NULL,
    kind             TEXT    NOT NULL,
    body             TEXT    NOT NULL,
    quoted_id        TEXT,
    wamid            TEXT,
    -- queued, sent, delivered, read, failed; state_rank orders them so late callbacks never
    -- move a message backwards.
    state            TEXT    NOT NULL,
    state_rank       BIGINT  NOT NULL,
    attempts         BIGINT  NOT NULL DEFAULT 0,
    -- Set while a send is in flight: still set on a retry means the earlier attempt's outcome is unknown.
    send_started_at  BIGINT,
    error_code       TEXT,
    error_message    TEXT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    sent_at          BIGINT,
    delivered_at     BIGINT,
    read_at          BIGINT,
    failed_at        BIGINT
);
CREATE UNIQUE INDEX whatsapp_outbound_wamid ON whatsapp_outbound(wamid) WHERE wamid IS NOT NULL;
CREATE INDEX whatsapp_outbound_recipient ON whatsapp_outbound(recipient, id);

CREATE TABLE whatsapp_notices (
    chat_id  TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    job_id   BIGINT  NOT NULL,
    sent_at  BIGINT  NOT NULL,
    PRIMARY KEY (chat_id, kind)
);
