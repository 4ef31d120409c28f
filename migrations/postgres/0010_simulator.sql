-- Simulated chats from the console's simulator: the same runtime, another transport. Both
-- directions are kept so the Conversations page can show them like WhatsApp chats.
CREATE TABLE simulator_messages (
    id          BIGSERIAL PRIMARY KEY,
    chat_id     TEXT    NOT NULL,
    direction   TEXT    NOT NULL,
    sender      TEXT    NOT NULL,
    text        TEXT    NOT NULL,
    message_id  TEXT    NOT NULL UNIQUE,
    -- Outbound: delivered (the simulator's transport cannot fail); inbound: received.
    state       TEXT    NOT NULL,
    trace_id    BIGINT,
    at          BIGINT NOT NULL
);
CREATE INDEX simulator_messages_chat ON simulator_messages(chat_id, id);
