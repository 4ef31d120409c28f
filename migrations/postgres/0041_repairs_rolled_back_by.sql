-- Who rolled an applied repair back (its approval's owner stays in decided_by), so the Repairs
-- page says who did what, and when.
ALTER TABLE repairs ADD COLUMN rolled_back_by TEXT;
