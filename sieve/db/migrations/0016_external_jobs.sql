-- External providers (design 004): the EXTERNAL task type, and one row per (task, stage) of an external job — the
-- engine's record of what it submitted where. The row is written BEFORE the provider is called (state
-- 'submitting', with the Idempotency-Key it sends) and gets the provider's job id before the submit counts as
-- done ('submitted'): an engine that restarts (or another replica) finds it and resumes the same provider job — it
-- re-sends a 'submitting' row's POST under the same key (the provider answers with the job it made), never a new
-- one. 'succeeded' / 'failed': terminal at the provider (the slot is released then); 'completed': the output is
-- stored as the task's result. Cost per job is recorded here and summed per provider and caller.
ALTER TABLE tasks DROP CONSTRAINT tasks_type_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_type_check CHECK (type IN ('TEXT', 'OCR_IMAGE', 'EXTERNAL'));

CREATE TABLE external_jobs (
    task_id         uuid        NOT NULL,
    stage           text        NOT NULL,
    stage_index     smallint    NOT NULL,
    provider        text        NOT NULL,
    caller          text        NOT NULL,
    pool            text        NOT NULL,
    -- the slot holder and Idempotency-Key: "task:stage:attempt" of the attempt that submitted
    holder          text        NOT NULL,
    attempt         integer     NOT NULL,
    provider_job_id text,
    state           text        NOT NULL CHECK (state IN ('submitting', 'submitted', 'succeeded', 'failed',
                                                          'completed')),
    result_url      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    submitted_at    timestamptz,
    finished_at     timestamptz,
    polls           integer     NOT NULL DEFAULT 0,
    cost            double precision NOT NULL DEFAULT 0,
    error           text,
    PRIMARY KEY (task_id, stage)
);
-- what the engine resumes: the jobs not terminal yet
CREATE INDEX external_jobs_open ON external_jobs (provider) WHERE state IN ('submitting', 'submitted');
-- what the engine's sweep completes: stages whose task's result may be stored
CREATE INDEX external_jobs_succeeded ON external_jobs (task_id) WHERE state = 'succeeded';
CREATE INDEX external_jobs_cost ON external_jobs (provider, caller);
