-- Who wrote a person's turn in a group chat, so the model can tell the members apart: their
-- number (never shown to the model) and the WhatsApp profile name they had then. Empty for
-- direct chats, the assistant's turns and turns stored before this.
ALTER TABLE chat_turns ADD COLUMN sender TEXT;
ALTER TABLE chat_turns ADD COLUMN sender_name TEXT;
