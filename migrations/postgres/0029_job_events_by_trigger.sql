-- On SQLite this migration adds triggers that write a claim's and a completion's job events in
-- the same statement. PostgreSQL's claim and completion already do, with data-modifying CTEs,
-- so nothing changes here but the version, which keeps both backends' migrations numbered alike.
SELECT 1;
