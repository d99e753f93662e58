-- Statistics (IntakeService.GetStats, sieve/db/stats.py): rollups kept up to date as tasks become final (folded from
-- the change feed) and devices report (a trigger), so that a query reads rollup rows, never the task table.
--
-- task_stats: one row per caller, UTC hour, device, type and verdict ('' for a task without a result): how many tasks
-- of that hour (their created_at) ended in each final status, how many detections devices reported (received_at;
-- ReportDetection, type TEXT for a text, OCR_IMAGE for an image), and a histogram of the succeeded tasks' processing
-- times (`processing_ms`, see stats_bucket). A day is the sum of its hours, at query time.
-- task_stats_words: per caller, hour, device and type, how often each lexicon word (with its category) was hit, in
-- results and in device reports.
--
-- Tasks are counted by `fold_task_stats()`, off the hot path: it reads the change feed of migration 0014 (what was
-- recorded since its last run, exactly once), counts each change into a final status (+1) or out of one (-1: a dead
-- letter requeued), joined with the tasks' results, and upserts each rollup key once, in key order, so that
-- concurrent folds (there is one at a time anyway) cannot deadlock. The writers of tasks pay nothing for the
-- statistics beyond the feed row they write anyway. The functions run as their owner (SECURITY
-- DEFINER, search_path pinned to this schema): the services that write tasks and reports need no right on the
-- rollups, and the intake only reads them (sieve/db/migrate.py). Deleting tasks (retention) leaves the rollups;
-- they have a retention of their own (SIEVE_STATS_RETENTION_DAYS).

CREATE TABLE task_stats (
    caller        text        NOT NULL,
    hour          timestamptz NOT NULL,
    device        text        NOT NULL,
    type          text        NOT NULL,
    verdict       text        NOT NULL,
    succeeded     bigint      NOT NULL DEFAULT 0,
    failed        bigint      NOT NULL DEFAULT 0,
    expired       bigint      NOT NULL DEFAULT 0,
    cancelled     bigint      NOT NULL DEFAULT 0,
    dead_lettered bigint      NOT NULL DEFAULT 0,
    reported      bigint      NOT NULL DEFAULT 0,
    -- element i (1-based): succeeded tasks whose processing time fell in bucket i - 1 (stats_bucket); trailing
    -- empty buckets are left out
    processing_ms integer[]   NOT NULL DEFAULT '{}',
    PRIMARY KEY (caller, hour, device, type, verdict)
);
-- an operator's query over every caller; retention
CREATE INDEX task_stats_hour ON task_stats (hour);

CREATE TABLE task_stats_words (
    caller   text        NOT NULL,
    hour     timestamptz NOT NULL,
    device   text        NOT NULL,
    type     text        NOT NULL,
    category text        NOT NULL,
    word     text        NOT NULL,
    hits     bigint      NOT NULL,
    PRIMARY KEY (caller, hour, device, type, category, word)
);
CREATE INDEX task_stats_words_hour ON task_stats_words (hour);

-- GetStats' queue counts (open tasks of one caller, by status): a range of this index, as large as the caller's
-- backlog. The status list is literal (sieve/db/stats.py has the same), so that the planner proves the predicate.
CREATE INDEX tasks_open_caller ON tasks (caller, status) WHERE status IN ('PENDING', 'ASSIGNED', 'RUNNING');

-- The histogram bucket of a processing time in ms: 4 buckets per doubling from 0.01 ms (bucket b holds
-- [0.01 * 2^(b/4), 0.01 * 2^((b+1)/4)) ms; bucket 0 everything below 0.0119 ms, bucket 119 everything from about
-- 2.9 hours). sieve/db/stats.py reads a bucket as its geometric middle: within 9 %.
CREATE FUNCTION stats_bucket(ms double precision) RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ms IS NULL THEN NULL
                WHEN ms < 0.0119 THEN 0
                ELSE least(119, floor(4 * ln(ms / 0.01) / ln(2)))::integer END
$$;

-- Adds `n` to bucket `bucket` of a histogram (NULL bucket: unchanged).
CREATE FUNCTION stats_histogram_step(h integer[], bucket integer, n integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    size integer := coalesce(array_length(h, 1), 0);
BEGIN
    IF bucket IS NULL OR n IS NULL THEN
        RETURN h;
    END IF;
    IF size <= bucket THEN
        h := h || array_fill(0, ARRAY[bucket + 1 - size]);
    END IF;
    h[bucket + 1] := h[bucket + 1] + n;
    RETURN h;
END
$$;

-- The histogram of (bucket, count) pairs.
CREATE AGGREGATE stats_histogram(integer, integer) (SFUNC = stats_histogram_step, STYPE = integer[], INITCOND = '{}');

-- where the fold stands in the change feed (migration 0014): the snapshot of its last run, as WatchTask keeps one
CREATE TABLE task_stats_folded (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    seen text    NOT NULL
);
INSERT INTO task_stats_folded (id, seen) VALUES (true, '1:1:');

-- Folds the task changes recorded since the last fold into the rollups, exactly once: one fold at a time (an
-- advisory lock), the changes its snapshot could not see read with this statement's snapshot, which becomes the
-- new position in the same statement. A change into a final status counts +1, one out of it (a dead letter
-- requeued) -1; each task's created hour, type and device and its result's verdict, timing and hits come from the
-- task and result rows (primary-key probes). The processing time of a result is what GetTask tells
-- (intake_svc/result_view.py): details.timings_ms "total" (an OCR task), else the sum of its stages, 0 when it names
-- none; clamped to [0, 1e12], read without raising on a value of another shape. Off the hot path: the scheduler runs
-- it every SIEVE_STATS_FOLD_INTERVAL_S, GetStats before it reads, retention before it deletes old changes.
CREATE FUNCTION fold_task_stats() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    moved bigint;
BEGIN
    -- its commit need not wait for the disk: a fold lost to a crash (position and rollups together) is done again
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('sieve-task-stats-fold:' || current_schema()));
    WITH pos AS (
        SELECT seen::pg_snapshot AS snap FROM task_stats_folded
    ), fresh AS (
        SELECT c.items FROM task_changes c, pos
        WHERE c.xid >= pg_snapshot_xmax(pos.snap) AND c.finals
        UNION ALL
        SELECT c.items FROM task_changes c, pos
        WHERE c.xid = ANY(ARRAY(SELECT pg_snapshot_xip(pos.snap))) AND c.finals
    ), moves AS (
        SELECT (it.item ->> 't')::uuid AS id, m.status, m.sign
        FROM fresh
        CROSS JOIN LATERAL jsonb_array_elements(fresh.items) AS it(item)
        CROSS JOIN LATERAL (
            SELECT e.value ->> 'status' AS cur,
                   lag(e.value ->> 'status', 1, it.item ->> 'p') OVER (ORDER BY e.n) AS prev
            FROM jsonb_array_elements(it.item -> 'e') WITH ORDINALITY AS e(value, n)
        ) pair
        CROSS JOIN LATERAL (VALUES (pair.cur, 1), (pair.prev, -1)) AS m(status, sign)
        WHERE pair.cur IS DISTINCT FROM pair.prev
          AND m.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')
    ), c AS MATERIALIZED (
        SELECT t.caller, date_trunc('hour', t.created_at, 'UTC') AS hour, t.device, t.type,
               coalesce(r.verdict, '') AS verdict, r.details, r.hits, m.status, m.sign,
               CASE WHEN jsonb_typeof(r.details -> 'timings_ms' -> 'total') = 'number'
                    THEN (r.details -> 'timings_ms' -> 'total')::numeric END AS total,
               CASE WHEN jsonb_typeof(r.details -> 'timings_ms' -> 'total') = 'number' THEN NULL
                    ELSE (SELECT sum(x.value::numeric)
                          FROM jsonb_each(CASE WHEN jsonb_typeof(r.details -> 'timings_ms') = 'object'
                                               THEN r.details -> 'timings_ms' ELSE '{}' END) AS x
                          WHERE jsonb_typeof(x.value) = 'number') END AS stages
        FROM moves m
        CROSS JOIN LATERAL (SELECT * FROM tasks WHERE tasks.id = m.id LIMIT 1) t
        LEFT JOIN LATERAL (SELECT * FROM results WHERE results.task_id = m.id LIMIT 1) r ON true
    ), counted AS (
        INSERT INTO task_stats AS s (caller, hour, device, type, verdict, succeeded, failed, expired, cancelled,
                                     dead_lettered, processing_ms)
        SELECT c.caller, c.hour, c.device, c.type, c.verdict,
               coalesce(sum(c.sign) FILTER (WHERE c.status = 'SUCCEEDED'), 0),
               coalesce(sum(c.sign) FILTER (WHERE c.status = 'FAILED'), 0),
               coalesce(sum(c.sign) FILTER (WHERE c.status = 'EXPIRED'), 0),
               coalesce(sum(c.sign) FILTER (WHERE c.status = 'CANCELLED'), 0),
               coalesce(sum(c.sign) FILTER (WHERE c.status = 'DEAD_LETTERED'), 0),
               stats_histogram(CASE WHEN c.status = 'SUCCEEDED' AND c.details IS NOT NULL
                                    THEN stats_bucket(least(greatest(coalesce(c.total, c.stages, 0), 0), 1e12)::float8)
                               END,
                               c.sign)
        FROM c
        GROUP BY c.caller, c.hour, c.device, c.type, c.verdict
        ORDER BY c.caller, c.hour, c.device, c.type, c.verdict
        ON CONFLICT (caller, hour, device, type, verdict) DO UPDATE SET
            succeeded = s.succeeded + excluded.succeeded,
            failed = s.failed + excluded.failed,
            expired = s.expired + excluded.expired,
            cancelled = s.cancelled + excluded.cancelled,
            dead_lettered = s.dead_lettered + excluded.dead_lettered,
            processing_ms = (SELECT coalesce(array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i), '{}')
                             FROM unnest(s.processing_ms, excluded.processing_ms) WITH ORDINALITY AS u(a, b, i))
    ), worded AS (
        INSERT INTO task_stats_words AS w (caller, hour, device, type, category, word, hits)
        SELECT c.caller, c.hour, c.device, c.type,
               left(coalesce(h.hit ->> 'category', ''), 100), left(h.hit ->> 'word', 200), sum(c.sign)
        FROM c
        CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(c.hits) = 'array' THEN c.hits ELSE '[]' END)
            AS h(hit)
        WHERE c.status = 'SUCCEEDED' AND h.hit ->> 'word' IS NOT NULL
        GROUP BY 1, 2, 3, 4, 5, 6
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT (caller, hour, device, type, category, word) DO UPDATE SET hits = w.hits + excluded.hits
    ), moved_to AS (
        -- nothing recorded since: nothing written (an idle system writes no WAL for its statistics)
        UPDATE task_stats_folded SET seen = pg_current_snapshot()::text
        WHERE EXISTS (SELECT 1 FROM task_changes c, pos
                      WHERE c.xid >= pg_snapshot_xmax(pos.snap)
                         OR c.xid = ANY(ARRAY(SELECT pg_snapshot_xip(pos.snap))))
    )
    SELECT count(*) INTO moved FROM c;
    RETURN moved;
END
$$;

CREATE FUNCTION task_stats_of_reports() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO task_stats AS s (caller, hour, device, type, verdict, reported)
    SELECT caller, date_trunc('hour', received_at, 'UTC'), device,
           CASE subject WHEN 'text' THEN 'TEXT' ELSE 'OCR_IMAGE' END, verdict, count(*)
    FROM new_reports
    GROUP BY 1, 2, 3, 4, 5
    ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (caller, hour, device, type, verdict) DO UPDATE SET reported = s.reported + excluded.reported;

    INSERT INTO task_stats_words AS w (caller, hour, device, type, category, word, hits)
    SELECT r.caller, date_trunc('hour', r.received_at, 'UTC'), r.device,
           CASE r.subject WHEN 'text' THEN 'TEXT' ELSE 'OCR_IMAGE' END,
           left(coalesce(h.hit ->> 'category', ''), 100), left(h.hit ->> 'word', 200), count(*)
    FROM new_reports r
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(r.hits) = 'array' THEN r.hits ELSE '[]' END)
        AS h(hit)
    WHERE h.hit ->> 'word' IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT (caller, hour, device, type, category, word) DO UPDATE SET hits = w.hits + excluded.hits;
    RETURN NULL;
END
$$;

CREATE TRIGGER task_stats AFTER INSERT ON device_reports
    REFERENCING NEW TABLE AS new_reports
    FOR EACH STATEMENT EXECUTE FUNCTION task_stats_of_reports();

-- definer functions find only this schema's tables (and temporary ones last, never first)
DO $pin$
BEGIN
    EXECUTE format('ALTER FUNCTION fold_task_stats() SET search_path = %I, pg_temp', current_schema());
    -- its plan's estimates (rows of JSON arrays) are huge: JIT would compile it, for seconds, on every call
    ALTER FUNCTION fold_task_stats() SET jit = off;
    EXECUTE format('ALTER FUNCTION task_stats_of_reports() SET search_path = %I, pg_temp', current_schema());
END
$pin$;
