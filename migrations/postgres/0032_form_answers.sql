-- What a console form's last plain post answered, kept for the page the browser is sent back
-- to, which takes it (once). Rows of their own, not a key in the session's record: requests of
-- one session save that record concurrently, and the last save would drop the answer. Kept
-- ten minutes at most.
CREATE TABLE form_answers (
    session_id TEXT NOT NULL,
    path TEXT NOT NULL,
    answer TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, path)
);
