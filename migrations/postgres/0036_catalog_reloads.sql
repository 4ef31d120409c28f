-- Tool catalog reloads across processes: a process that reloads its catalog (the console's
-- button, a repair's approval, a SIGHUP) counts it here, and every other process of the
-- deployment (a `gatehouse worker`, another `serve`) sees the count move and reloads its own.
CREATE TABLE catalog_reloads (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL,
    reloaded_at BIGINT NOT NULL
);
INSERT INTO catalog_reloads (id, generation, reloaded_at) VALUES (1, 0, 0);
