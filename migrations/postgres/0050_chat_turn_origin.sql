-- Where an assistant's turn in chat memory came from: NULL for normal chat's own model, or
-- 'tool_lane' for the tool lane's reply and the later messages jobs send (a tool's summarised
-- answer, ...), which a model reads again as data, never as instructions.
ALTER TABLE chat_turns ADD COLUMN origin TEXT;
