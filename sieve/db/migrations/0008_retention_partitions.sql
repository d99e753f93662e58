-- Retention (sieve/db/retention.py): tasks and results become range-partitioned by task id, one partition per UTC
-- day, so that purging a day past SIEVE_RETENTION_DAYS is dropping its two partitions (rows, results, image bytes
-- and history at once), not a DELETE storm. Task ids are UUIDv7 (sieve/ids.py): their first 48 bits are the Unix
-- time in ms, so the day of `[uuid7_floor(day start), uuid7_floor(next day start))` holds exactly the tasks created
-- that day; the primary key stays the plain id and a lookup by id reads one partition.
--
-- A DEFAULT partition catches ids outside every day partition: the random (v4) ids of tasks recorded before this
-- migration, and tasks of a day whose partition was not made in time. Making a day's partition later moves such
-- rows into it; retention deletes old final rows of the default partition in small batches.
--
-- The idempotency key cannot stay a unique index of tasks (a unique index of a partitioned table must contain the
-- partition key): it moves to idempotency_keys, one row per (caller, device, key), pointing at its task; its rows
-- go with their task. The foreign key results -> tasks is not kept: results are written only for a task that the
-- same statement finds (TaskStore.finish) and a day's results and tasks are dropped together.
--
-- Existing rows, indexes (the primary key and the idempotency index excepted), privileges and foreign keys of
-- other tables are carried over to the new tables.

-- The smallest UUID whose first 48 bits are `ms` (every other bit zero): a partition bound (sieve/ids.py).
CREATE FUNCTION uuid7_floor(ms bigint) RETURNS uuid LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '00000000000000000000')::uuid
$$;

CREATE TABLE idempotency_keys (
    caller     text        NOT NULL,
    device     text        NOT NULL,
    key        text        NOT NULL,
    task_id    uuid        NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (caller, device, key)
);
-- purging the keys of a day's tasks (a range of task ids)
CREATE INDEX idempotency_keys_task ON idempotency_keys (task_id);

DO $migration$
DECLARE
    tbl         text;
    key_col     text;
    index_defs  text[];
    fk_defs     text[][];
    cols        text;
    grant_row   record;
    r           record;
    def         text;
    today       date := (now() AT TIME ZONE 'UTC')::date;
    day         date;
    lo          bigint;
    hi          bigint;
BEGIN
    INSERT INTO idempotency_keys (caller, device, key, task_id, created_at)
    SELECT caller, device, idempotency_key, id, created_at FROM tasks WHERE idempotency_key IS NOT NULL
    ON CONFLICT DO NOTHING;

    FOREACH tbl IN ARRAY ARRAY['tasks', 'results'] LOOP
        key_col := CASE tbl WHEN 'tasks' THEN 'id' ELSE 'task_id' END;

        -- indexes to build again on the new table (definitions read while the names still mean the old table)
        SELECT coalesce(array_agg(pg_get_indexdef(i.indexrelid) ORDER BY c.relname), '{}') INTO index_defs
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = tbl::regclass AND NOT i.indisprimary AND c.relname <> 'tasks_idempotency';
        FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                 WHERE i.indrelid = tbl::regclass AND NOT i.indisprimary
                   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) LOOP
            EXECUTE format('DROP INDEX %I', r.relname);
        END LOOP;

        -- foreign keys of other tables that point at this one (results -> tasks is dropped with results)
        fk_defs := '{}';
        FOR r IN SELECT k.conname, k.conrelid::regclass::text AS src, pg_get_constraintdef(k.oid) AS def
                 FROM pg_constraint k
                 WHERE k.contype = 'f' AND k.confrelid = tbl::regclass
                   AND k.conrelid NOT IN ('tasks'::regclass, 'results'::regclass) LOOP
            fk_defs := fk_defs || ARRAY[[r.src, r.conname, r.def]];
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.src, r.conname);
        END LOOP;

        EXECUTE format('ALTER TABLE %I RENAME TO %I', tbl, tbl || '_unpartitioned');
        FOR r IN SELECT conname FROM pg_constraint
                 WHERE conrelid = (tbl || '_unpartitioned')::regclass AND contype IN ('p', 'u', 'x') LOOP
            EXECUTE format('ALTER TABLE %I RENAME CONSTRAINT %I TO %I', tbl || '_unpartitioned', r.conname,
                           left('old_' || r.conname, 63));
        END LOOP;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (%I)',
                       tbl, tbl || '_unpartitioned', key_col);
        EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', tbl || '_default', tbl);
        FOR i IN 0..2 LOOP
            day := today + i;
            lo := (extract(epoch FROM day::timestamp AT TIME ZONE 'UTC') * 1000)::bigint;
            hi := (extract(epoch FROM (day + 1)::timestamp AT TIME ZONE 'UTC') * 1000)::bigint;
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                           tbl || '_p' || to_char(day, 'YYYYMMDD'), tbl, uuid7_floor(lo), uuid7_floor(hi));
        END LOOP;

        SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols FROM pg_attribute
        WHERE attrelid = (tbl || '_unpartitioned')::regclass AND attnum > 0 AND NOT attisdropped
          AND attgenerated = '';
        EXECUTE format('INSERT INTO %I (%s) SELECT %s FROM %I', tbl, cols, cols, tbl || '_unpartitioned');

        EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (%I)', tbl, key_col);
        FOREACH def IN ARRAY index_defs LOOP
            EXECUTE def;
        END LOOP;
        FOR grant_row IN SELECT a.privilege_type, a.grantee, a.is_grantable
                         FROM pg_class c, aclexplode(c.relacl) a
                         WHERE c.oid = (tbl || '_unpartitioned')::regclass AND a.grantee <> c.relowner LOOP
            EXECUTE format('GRANT %s ON %I TO %s%s', grant_row.privilege_type, tbl,
                           CASE WHEN grant_row.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(grant_row.grantee)) END,
                           CASE WHEN grant_row.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            IF tbl = 'tasks' THEN  -- whoever may write tasks writes their idempotency keys
                EXECUTE format('GRANT %s ON idempotency_keys TO %s', grant_row.privilege_type,
                               CASE WHEN grant_row.grantee = 0 THEN 'PUBLIC'
                                    ELSE quote_ident(pg_get_userbyid(grant_row.grantee)) END);
            END IF;
        END LOOP;
        IF fk_defs <> '{}' THEN
            FOR i IN 1..array_length(fk_defs, 1) LOOP
                -- read before the rename: REFERENCES names the new table now
                EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', fk_defs[i][1], fk_defs[i][2], fk_defs[i][3]);
            END LOOP;
        END IF;
    END LOOP;

    -- no CASCADE: a view or rule on the old tables makes the migration fail rather than vanish
    DROP TABLE results_unpartitioned;
    DROP TABLE tasks_unpartitioned;
END
$migration$;
