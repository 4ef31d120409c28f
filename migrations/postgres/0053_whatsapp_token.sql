-- Since when Meta refuses the WhatsApp access token, and which one (its SHA-256), for every
-- process: the one whose send was refused sets it, any whose send Meta took clears it, and every
-- console whose process holds that token shows it (a console whose own process sends nothing,
-- replies going out from `gatehouse worker` processes, showed no banner while every reply
-- waited). A console started with another token does not.
CREATE TABLE whatsapp_token (
    id              INTEGER PRIMARY KEY,
    rejected_since  BIGINT,
    token_sha256    TEXT
);
INSERT INTO whatsapp_token (id, rejected_since) VALUES (1, NULL);
