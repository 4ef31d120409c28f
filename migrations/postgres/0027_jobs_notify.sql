-- Wake-ups for new jobs come from the database: every statement that inserts jobs notifies the
-- workers' channel once per queue it wrote to (PostgreSQL delivers it when the transaction
-- commits, drops it on rollback, and sends identical ones of one transaction once). The enqueue
-- no longer spends a round trip on its own pg_notify, and no path that inserts jobs can forget
-- it. The payload is the queue's name, as before (server/src/jobs/queue.rs NOTIFY_CHANNEL).
CREATE FUNCTION gatehouse_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gatehouse_jobs', queue) FROM (SELECT DISTINCT queue FROM inserted) AS queues;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify AFTER INSERT ON jobs REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION gatehouse_jobs_notify();
