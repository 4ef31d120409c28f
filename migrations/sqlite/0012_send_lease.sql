-- A lease on each outbound part's send: the sender that marks a part "sending" holds it until
-- its Graph API request has an answer, so a second run of the same job (a rescued lease, a
-- second process) cannot send the same part meanwhile. A crash leaves the lease to run out.
ALTER TABLE whatsapp_outbound ADD COLUMN send_token TEXT;
ALTER TABLE whatsapp_outbound ADD COLUMN send_lease_until INTEGER;
