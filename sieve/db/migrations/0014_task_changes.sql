-- What happens to a task, told outside: the change feed behind WatchTask (task_changes) and the outbox of
-- completion callbacks (callback_deliveries). Both are written by triggers on tasks, in the statement that makes
-- the change, so no path that changes a task (sieve/db/tasks.py has many) can forget them and a change is
-- recorded if and only if it committed.
--
-- task_changes: one row per statement that changed tasks, with, for each task, the history entries it appended
-- (the first at its place in the history) and the status before them; each entry whose status differs from the one
-- before is a change (a note that keeps the status is not). One row for a batch, not one per task: the hot path
-- (a SubmitBatch of 1 000, a worker's group commit of results) pays one insert and one index entry. `xid` is the writing transaction: a reader (sieve/db/task_changes.py)
-- remembers the snapshot it read under and next reads exactly the rows that snapshot could not see — those of
-- the transactions still running then and of later ones — so a change that commits late, with an older id, is
-- never skipped, and a stream resumed from a cursor (two snapshots and an id) neither misses nor repeats one.
-- One task's changes are numbered in their real order: the row lock orders the statements that change it.
--
-- callback_deliveries: one row per time a task with a callback_url became final; the scheduler's notifier
-- (scheduler_svc/callbacks.py) claims due rows (FOR UPDATE SKIP LOCKED; `next_at` moved ahead is the claim's
-- lease), POSTs, and records the outcome. A delivery is never lost to a restart: it is a row until it is
-- DELIVERED or GAVE_UP.
--
-- The trigger functions run as the schema owner (SECURITY DEFINER, search_path this schema then pg_temp), so the
-- services' roles need no privilege to write either table by hand. One NOTIFY sieve_task_changes per statement
-- that recorded a change (payload: the schema) wakes the watchers, one NOTIFY sieve_callbacks per statement that
-- added a delivery wakes the notifiers; polling backs both up.

ALTER TABLE tasks ADD COLUMN callback_url text;

CREATE TABLE task_changes (
    id        bigint      GENERATED ALWAYS AS IDENTITY,
    xid       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- one element per task the statement changed, in task id order: {"t": task id, "c": caller, "d": device,
    -- "s": the place in its history of the first entry appended, "p": its status before them (null for a new
    -- task), "e": the entries appended}; an entry whose status differs from the one before is a change
    items     jsonb       NOT NULL,
    -- some task of the row entered or left a final status (what GetStats' fold of migration 0015 reads)
    finals    boolean     NOT NULL DEFAULT false,
    logged_at timestamptz NOT NULL DEFAULT now()
);
-- the rows a snapshot could not see (a watcher filters their items by caller, device, task)
CREATE INDEX task_changes_xid ON task_changes (xid);

-- the newest transaction whose changes retention deleted: a cursor from before it may have lost some
CREATE TABLE task_changes_purged (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    up_to   xid8    NOT NULL
);
INSERT INTO task_changes_purged (id, up_to) VALUES (true, '0'::xid8);

CREATE TABLE callback_deliveries (
    task_id          uuid        NOT NULL,
    seq              integer     NOT NULL,
    caller           text        NOT NULL,
    url              text        NOT NULL,
    status           text        NOT NULL,
    state            text        NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'DELIVERED', 'GAVE_UP')),
    attempts         integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    next_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    last_http_status integer,
    last_error       text,
    -- the JSON sent, fixed at the first attempt so that every attempt signs and sends the same bytes
    body             bytea,
    PRIMARY KEY (task_id, seq)
);
CREATE INDEX callback_deliveries_due ON callback_deliveries (next_at) WHERE state = 'PENDING';
CREATE INDEX callback_deliveries_created ON callback_deliveries (created_at);

CREATE FUNCTION task_changes_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO task_changes (items)
    SELECT jsonb_agg(jsonb_build_object('t', n.id, 'c', n.caller, 'd', n.device, 's', 1, 'p', NULL, 'e', n.history)
                     ORDER BY n.id)
    FROM new_rows n
    HAVING count(*) > 0;
    IF FOUND THEN
        PERFORM pg_notify('sieve_task_changes', current_schema());
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION task_changes_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    changed boolean;
BEGIN
    -- one row for the statement: each task it moved (a note alone, keeping the status, is left out)
    INSERT INTO task_changes (items, finals)
    SELECT jsonb_agg(jsonb_build_object(
               't', n.id, 'c', n.caller, 'd', n.device, 's', jsonb_array_length(o.history) + 1, 'p', o.status,
               'e', jsonb_path_query_array(n.history, '$[$from to last]',
                                           jsonb_build_object('from', jsonb_array_length(o.history))))
           ORDER BY n.id),
           bool_or(n.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')
                   OR o.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED'))
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE jsonb_array_length(n.history) > jsonb_array_length(o.history)
      AND (n.status <> o.status OR jsonb_array_length(n.history) > jsonb_array_length(o.history) + 1)
    HAVING count(*) > 0;
    changed := FOUND;

    INSERT INTO callback_deliveries (task_id, seq, caller, url, status)
    SELECT n.id, jsonb_array_length(n.history), n.caller, n.callback_url, n.status
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    WHERE n.callback_url IS NOT NULL
      AND n.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')
      AND o.status NOT IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')
    ORDER BY n.id
    ON CONFLICT (task_id, seq) DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('sieve_callbacks', current_schema());
    END IF;

    IF changed THEN
        PERFORM pg_notify('sieve_task_changes', current_schema());
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER task_changes_inserted AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_changes_inserted();
CREATE TRIGGER task_changes_updated AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_changes_updated();

-- run as the owner, they find only this schema's tables: pg_temp last, so no session's temporary table can stand in
DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION task_changes_inserted() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION task_changes_updated() SET search_path = %I, pg_temp', current_schema());
    -- no JIT for what runs with every write of a task (estimates on transition tables can pass its threshold)
    ALTER FUNCTION task_changes_inserted() SET jit = off;
    ALTER FUNCTION task_changes_updated() SET jit = off;
END
$pin$;
