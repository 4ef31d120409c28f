-- Sessions are stored under the SHA-256 of their id (the cookie's value), and their records
-- no longer hold the id: a copy of the database (a backup, a dump, a file left readable) gives
-- no one a session. The sessions stored under their plain ids, and the form answers kept for
-- them, cannot be found that way: they are removed, and owners sign in once again.
DELETE FROM form_answers;
DELETE FROM sessions;
