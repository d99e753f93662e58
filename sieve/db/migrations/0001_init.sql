-- Sieve's record: tasks (with payload and status history), results (one per task), the lexicon.
-- Applied in the schema named by SIEVE_DATABASE_SCHEMA (search_path is set to it).

CREATE TABLE tasks (
    id              uuid PRIMARY KEY,
    device          text        NOT NULL,
    type            text        NOT NULL CHECK (type IN ('TEXT', 'OCR_IMAGE')),
    priority        smallint    NOT NULL CHECK (priority BETWEEN 1 AND 5),
    status          text        NOT NULL CHECK (status IN ('PENDING', 'ASSIGNED', 'RUNNING', 'SUCCEEDED',
                                                           'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')),
    attempts        integer     NOT NULL DEFAULT 0,
    caller          text        NOT NULL,
    idempotency_key text,
    payload_text    text,
    payload_bytes   bytea,
    payload_url     text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    -- when the task last entered its device queue (aging); kept for rebuilding Redis from here
    enqueued_at     timestamptz NOT NULL,
    error           text,
    worker_id       text,
    trace_context   text,
    -- [{"status": "PENDING", "at": "...", "attempt": 0, "detail": ""}, ...]
    history         jsonb       NOT NULL DEFAULT '[]'::jsonb
);

CREATE UNIQUE INDEX tasks_idempotency ON tasks (caller, device, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- unfinished tasks, oldest first: what a rebuild of Redis re-queues
CREATE INDEX tasks_unfinished ON tasks (enqueued_at)
    WHERE status IN ('PENDING', 'ASSIGNED', 'RUNNING');
CREATE INDEX tasks_device_created ON tasks (device, created_at);

CREATE TABLE results (
    task_id    uuid PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    verdict    text        NOT NULL CHECK (verdict IN ('PASS', 'REVIEW', 'BLOCK')),
    hits       jsonb       NOT NULL,
    text       text        NOT NULL,
    details    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    worker_id  text        NOT NULL,
    attempt    integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE lexicon (
    word       text PRIMARY KEY,
    category   text        NOT NULL,
    severity   smallint    NOT NULL CHECK (severity BETWEEN 1 AND 5),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- bumped by any change of the lexicon; workers reload when it moves (and on NOTIFY sieve_lexicon)
CREATE TABLE lexicon_version (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    version bigint  NOT NULL
);
INSERT INTO lexicon_version (id, version) VALUES (true, 0);

CREATE FUNCTION lexicon_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE lexicon_version SET version = version + 1;
    PERFORM pg_notify('sieve_lexicon', current_schema());
    RETURN NULL;
END $$;

CREATE TRIGGER lexicon_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lexicon
    FOR EACH STATEMENT EXECUTE FUNCTION lexicon_changed();
