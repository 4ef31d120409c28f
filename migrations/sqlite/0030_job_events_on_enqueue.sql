-- A job's first event (its initial state: available, scheduled or pending) was written by a
-- second statement after the jobs' insert: on the one writer connection, another round trip to
-- its thread for every enqueue, the webhook's group commit included. This trigger writes it in
-- the insert's own statement, as PostgreSQL's enqueue does with a data-modifying CTE and as
-- migration 0029 does for claims and completions. It fires only for rows inserted (a job whose
-- dedupe key is taken is skipped by ON CONFLICT DO NOTHING and gets no event).
CREATE TRIGGER job_events_on_enqueue AFTER INSERT ON jobs
BEGIN
    INSERT INTO job_events (job_id, at, state, attempt) VALUES (NEW.id, NEW.created_at, NEW.state, NEW.attempt);
END;
