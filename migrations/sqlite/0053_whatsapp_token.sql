-- Since when Meta refuses the WhatsApp access token, for every process: the one whose send was
-- refused sets it, any whose send goes out clears it, and every console's banner reads it (a
-- console whose own process sends nothing, replies going out from `gatehouse worker`
-- processes, showed no banner while every reply waited).
CREATE TABLE whatsapp_token (
    id              INTEGER PRIMARY KEY,
    rejected_since  INTEGER
);
INSERT INTO whatsapp_token (id, rejected_since) VALUES (1, NULL);
