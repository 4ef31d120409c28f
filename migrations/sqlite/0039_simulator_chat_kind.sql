-- Whether a simulated message was in a group chat (1) or a direct one (0), so the console's
-- "Continue this chat" goes on in the same kind of chat. Messages stored before this read as
-- direct.
ALTER TABLE simulator_messages ADD COLUMN is_group INTEGER NOT NULL DEFAULT 0;
