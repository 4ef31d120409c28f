-- The Conversations page lists chats by their latest message, with how many each has and the
-- customer's latest profile name. It used to count every message ever stored
-- (whatsapp_inbound, whatsapp_outbound, simulator_messages, all kept for ever) at each load, and
-- to look for a name through every message of a chat that had none (a group); now each chat's
-- count, latest time and name are kept here, by triggers, in the transaction that stores the
-- message.
CREATE TABLE chats (
    channel  TEXT    NOT NULL,
    chat_id  TEXT    NOT NULL,
    messages INTEGER NOT NULL,
    last_at  INTEGER NOT NULL,
    -- A WhatsApp customer's latest profile name (not a group's: its senders differ).
    name     TEXT,
    PRIMARY KEY (channel, chat_id)
);
CREATE INDEX chats_last ON chats(last_at);

INSERT INTO chats (channel, chat_id, messages, last_at)
SELECT channel, chat_id, SUM(n), MAX(last_at) FROM (
    SELECT 'simulator' AS channel, chat_id, COUNT(*) AS n, MAX(at) AS last_at FROM simulator_messages GROUP BY chat_id
    UNION ALL SELECT 'whatsapp', chat_id, COUNT(*), MAX(received_at) FROM whatsapp_inbound GROUP BY chat_id
    UNION ALL SELECT 'whatsapp', recipient, COUNT(*), MAX(created_at) FROM whatsapp_outbound GROUP BY recipient
) GROUP BY channel, chat_id;
UPDATE chats SET name = (
    SELECT w.sender_name FROM whatsapp_inbound w WHERE w.chat_id = chats.chat_id AND w.is_group = 0 AND w.sender_name IS NOT NULL ORDER BY w.id DESC LIMIT 1
) WHERE channel = 'whatsapp';

CREATE TRIGGER chats_whatsapp_inbound AFTER INSERT ON whatsapp_inbound BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at, name)
    VALUES ('whatsapp', NEW.chat_id, 1, NEW.received_at, CASE WHEN NEW.is_group = 0 THEN NEW.sender_name END)
    ON CONFLICT (channel, chat_id) DO UPDATE SET messages = messages + 1, last_at = MAX(last_at, excluded.last_at), name = COALESCE(excluded.name, name);
END;
CREATE TRIGGER chats_whatsapp_outbound AFTER INSERT ON whatsapp_outbound BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at) VALUES ('whatsapp', NEW.recipient, 1, NEW.created_at)
    ON CONFLICT (channel, chat_id) DO UPDATE SET messages = messages + 1, last_at = MAX(last_at, excluded.last_at);
END;
CREATE TRIGGER chats_simulator AFTER INSERT ON simulator_messages BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at) VALUES ('simulator', NEW.chat_id, 1, NEW.at)
    ON CONFLICT (channel, chat_id) DO UPDATE SET messages = messages + 1, last_at = MAX(last_at, excluded.last_at);
END;
