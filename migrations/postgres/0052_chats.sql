-- The Conversations page lists chats by their latest message, with how many each has and the
-- customer's latest profile name. It used to count every message ever stored
-- (whatsapp_inbound, whatsapp_outbound, simulator_messages, all kept for ever) at each load, and
-- to look for a name through every message of a chat that had none (a group); now each chat's
-- count, latest time and name are kept here, by triggers, in the transaction that stores the
-- message. The triggers run once a statement, over the rows it inserted, and take its chats in
-- order, so that two processes' group commits of one statement each (messages alone) lock the
-- chats they share in the same order. The tables are locked against writes while the counts
-- are filled, so that a message an older process stores meanwhile is not left out of them.
CREATE TABLE chats (
    channel  TEXT   NOT NULL,
    chat_id  TEXT   NOT NULL,
    messages BIGINT NOT NULL,
    last_at  BIGINT NOT NULL,
    -- A WhatsApp customer's latest profile name (not a group's: its senders differ).
    name     TEXT,
    PRIMARY KEY (channel, chat_id)
);
CREATE INDEX chats_last ON chats(last_at);

LOCK TABLE whatsapp_inbound, whatsapp_outbound, simulator_messages IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO chats (channel, chat_id, messages, last_at)
SELECT channel, chat_id, SUM(n), MAX(last_at) FROM (
    SELECT 'simulator' AS channel, chat_id, COUNT(*) AS n, MAX(at) AS last_at FROM simulator_messages GROUP BY chat_id
    UNION ALL SELECT 'whatsapp', chat_id, COUNT(*), MAX(received_at) FROM whatsapp_inbound GROUP BY chat_id
    UNION ALL SELECT 'whatsapp', recipient, COUNT(*), MAX(created_at) FROM whatsapp_outbound GROUP BY recipient
) AS c GROUP BY channel, chat_id;
UPDATE chats SET name = (
    SELECT w.sender_name FROM whatsapp_inbound w WHERE w.chat_id = chats.chat_id AND w.is_group = 0 AND w.sender_name IS NOT NULL ORDER BY w.id DESC LIMIT 1
) WHERE channel = 'whatsapp';

CREATE FUNCTION chats_whatsapp_inbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at, name)
    SELECT 'whatsapp', g.chat_id, COUNT(*), MAX(g.received_at),
           (array_agg(g.sender_name ORDER BY g.id DESC) FILTER (WHERE g.is_group = 0 AND g.sender_name IS NOT NULL))[1]
    FROM inserted g GROUP BY g.chat_id ORDER BY g.chat_id
    ON CONFLICT (channel, chat_id) DO UPDATE
    SET messages = chats.messages + excluded.messages, last_at = GREATEST(chats.last_at, excluded.last_at), name = COALESCE(excluded.name, chats.name);
    RETURN NULL;
END $$;
CREATE TRIGGER chats_whatsapp_inbound AFTER INSERT ON whatsapp_inbound
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION chats_whatsapp_inbound();

CREATE FUNCTION chats_whatsapp_outbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at)
    SELECT 'whatsapp', recipient, COUNT(*), MAX(created_at) FROM inserted GROUP BY recipient ORDER BY recipient
    ON CONFLICT (channel, chat_id) DO UPDATE SET messages = chats.messages + excluded.messages, last_at = GREATEST(chats.last_at, excluded.last_at);
    RETURN NULL;
END $$;
CREATE TRIGGER chats_whatsapp_outbound AFTER INSERT ON whatsapp_outbound
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION chats_whatsapp_outbound();

CREATE FUNCTION chats_simulator() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chats (channel, chat_id, messages, last_at)
    SELECT 'simulator', chat_id, COUNT(*), MAX(at) FROM inserted GROUP BY chat_id ORDER BY chat_id
    ON CONFLICT (channel, chat_id) DO UPDATE SET messages = chats.messages + excluded.messages, last_at = GREATEST(chats.last_at, excluded.last_at);
    RETURN NULL;
END $$;
CREATE TRIGGER chats_simulator AFTER INSERT ON simulator_messages
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION chats_simulator();
