-- Who wrote a person's turn in a group chat, so the model can tell the members apart: their
-- number (never shown to the model) and the label the model reads for them (their WhatsApp
-- profile name then, or "member N"), fixed when the turn is stored so that it reads the same in
-- every later call, summary and replay. Empty for direct chats, the assistant's turns and turns
-- stored before this.
ALTER TABLE chat_turns ADD COLUMN sender TEXT;
ALTER TABLE chat_turns ADD COLUMN sender_label TEXT;
