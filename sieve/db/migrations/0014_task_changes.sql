-- What happens to a task, told outside: the change feed behind WatchTask (task_changes) and the outbox of
-- completion callbacks (callback_deliveries). Both are written by triggers on tasks, in the statement that makes
-- the change, so no path that changes a task (sieve/db/tasks.py has many) can forget them and a change is
-- recorded if and only if it committed.
--
-- task_changes: one row per status change appended to a task's history (a note that keeps the status is not a
-- change), `seq` its place in that history. `xid` is the writing transaction: a reader (sieve/db/task_changes.py)
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
    task_id   uuid        NOT NULL,
    caller    text        NOT NULL,
    device    text        NOT NULL,
    seq       integer     NOT NULL,
    status    text        NOT NULL,
    at        timestamptz NOT NULL,
    attempt   integer     NOT NULL,
    detail    text        NOT NULL,
    logged_at timestamptz NOT NULL DEFAULT now()
);
-- a watcher of one caller, and an operator's of every caller: the rows a snapshot could not see
CREATE INDEX task_changes_caller_xid ON task_changes (caller, xid);
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
    INSERT INTO task_changes (task_id, caller, device, seq, status, at, attempt, detail)
    SELECT n.id, n.caller, n.device, e.seq, e.h->>'status', (e.h->>'at')::timestamptz,
           COALESCE((e.h->>'attempt')::integer, 0), COALESCE(e.h->>'detail', '')
    FROM new_rows n
    CROSS JOIN LATERAL jsonb_array_elements(n.history) WITH ORDINALITY AS e(h, seq)
    WHERE e.seq = 1 OR e.h->>'status' IS DISTINCT FROM n.history->(e.seq::integer - 2)->>'status'
    ORDER BY n.id, e.seq;
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
    INSERT INTO task_changes (task_id, caller, device, seq, status, at, attempt, detail)
    SELECT n.id, n.caller, n.device, e.seq, e.h->>'status', (e.h->>'at')::timestamptz,
           COALESCE((e.h->>'attempt')::integer, 0), COALESCE(e.h->>'detail', '')
    FROM new_rows n
    JOIN old_rows o ON o.id = n.id
    CROSS JOIN LATERAL jsonb_array_elements(n.history) WITH ORDINALITY AS e(h, seq)
    WHERE e.seq > jsonb_array_length(o.history)
      AND (e.seq = 1 OR e.h->>'status' IS DISTINCT FROM n.history->(e.seq::integer - 2)->>'status')
    ORDER BY n.id, e.seq;
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
END
$pin$;
