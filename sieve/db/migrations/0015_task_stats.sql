-- Statistics (IntakeService.GetStats, sieve/db/stats.py): rollups kept up to date by triggers as tasks become final
-- and devices report, so that a query reads rollup rows, never the task table.
--
-- task_stats: one row per caller, UTC hour, device, type and verdict ('' for a task without a result): how many tasks
-- of that hour (their created_at) ended in each final status, how many detections devices reported (received_at;
-- ReportDetection, type TEXT for a text, OCR_IMAGE for an image), and a histogram of the succeeded tasks' processing
-- times (`processing_ms`, see stats_bucket). A day is the sum of its hours, at query time.
-- task_stats_words: per caller, hour, device and type, how often each lexicon word (with its category) was hit, in
-- results and in device reports.
--
-- The tasks trigger is one per UPDATE statement (not per row), with transition tables: it counts the rows whose
-- status changed into a final one (+1) or out of one (-1: a dead letter requeued), joined with their results (the
-- result TaskStore.finish inserts in the same statement is seen), and upserts each rollup key once, in key order, so
-- that concurrent batches cannot deadlock. Statements that move no task into or out of a final status (hand-outs,
-- starts, put-backs, notes) leave after a scan of their own rows. The functions run as their owner (SECURITY
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

-- The processing time of a result is what GetTask tells (intake_svc/result_view.py): details.timings_ms "total" (an
-- OCR task), else the sum of its stages, 0 when it names none; clamped to [0, 1e12]. Read without raising on a value
-- of another shape (a result write must not fail for its statistics), and inline in the statement rather than in a
-- function of its own: an SQL function with a subquery is planned again on every trigger call.
CREATE FUNCTION task_stats_of_tasks() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_tasks WHERE status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED'))
       AND NOT EXISTS (SELECT 1 FROM old_tasks
                       WHERE status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')) THEN
        RETURN NULL;  -- nothing became final or stopped being so
    END IF;

    -- one statement: the moved tasks joined with their results once (each result a primary-key probe), then both
    -- rollups upserted from that, in key order (concurrent batches cannot deadlock)
    WITH c AS MATERIALIZED (
        SELECT n.caller, date_trunc('hour', n.created_at, 'UTC') AS hour, n.device, n.type,
               coalesce(r.verdict, '') AS verdict, r.details, r.hits, x.status, x.sign,
               CASE WHEN jsonb_typeof(r.details -> 'timings_ms' -> 'total') = 'number'
                    THEN (r.details -> 'timings_ms' -> 'total')::numeric END AS total,
               CASE WHEN jsonb_typeof(r.details -> 'timings_ms' -> 'total') = 'number' THEN NULL
                    ELSE (SELECT sum(t.value::numeric)
                          FROM jsonb_each(CASE WHEN jsonb_typeof(r.details -> 'timings_ms') = 'object'
                                               THEN r.details -> 'timings_ms' ELSE '{}' END) AS t
                          WHERE jsonb_typeof(t.value) = 'number') END AS stages
        FROM new_tasks n
        JOIN old_tasks o ON o.id = n.id AND o.status IS DISTINCT FROM n.status
        CROSS JOIN LATERAL (VALUES (n.status, 1), (o.status, -1)) AS x(status, sign)
        LEFT JOIN LATERAL (SELECT * FROM results WHERE results.task_id = n.id LIMIT 1) r ON true
        WHERE x.status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')
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
    )
    INSERT INTO task_stats_words AS w (caller, hour, device, type, category, word, hits)
    SELECT c.caller, c.hour, c.device, c.type,
           left(coalesce(h.hit ->> 'category', ''), 100), left(h.hit ->> 'word', 200), sum(c.sign)
    FROM c
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(c.hits) = 'array' THEN c.hits ELSE '[]' END)
        AS h(hit)
    WHERE c.status = 'SUCCEEDED' AND h.hit ->> 'word' IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 1, 2, 3, 4, 5, 6
    ON CONFLICT (caller, hour, device, type, category, word) DO UPDATE SET hits = w.hits + excluded.hits;
    RETURN NULL;
END
$$;

CREATE TRIGGER task_stats AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_tasks NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION task_stats_of_tasks();

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
    EXECUTE format('ALTER FUNCTION task_stats_of_tasks() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION task_stats_of_reports() SET search_path = %I, pg_temp', current_schema());
END
$pin$;
