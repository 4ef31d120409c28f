-- The sender's WhatsApp profile name, as the webhook's `contacts` gave it with the message
-- (untrusted, set by the customer, bounded): the console shows it beside the number. NULL when
-- the webhook named nobody.
ALTER TABLE whatsapp_inbound ADD COLUMN sender_name TEXT;
