-- The audit log (sieve/audit.py writes it, SchedulerService.ListAuditEvents lists it, newest first): every call
-- of an operator-only RPC, every refused attempt at one, and every operator read or change of another caller's
-- task. Service roles get INSERT (the scheduler also SELECT) and never UPDATE or DELETE: a service cannot rewrite
-- what it did. Pruning old rows is for the owner role (deploy/README.md). Touches no other table.
CREATE TABLE audit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- when the call began
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- operator: an operator-only RPC reached its handler; refused: an attempt at one was refused
    -- (UNAUTHENTICATED / PERMISSION_DENIED) before it; cross_tenant: an operator read or changed a task of
    -- another caller (GetTask, CancelTask, ...)
    kind        text        NOT NULL CHECK (kind IN ('operator', 'refused', 'cross_tenant')),
    -- the credential's name ('' when no valid credential was presented) and its roles
    principal   text        NOT NULL,
    roles       text[]      NOT NULL DEFAULT '{}',
    -- full gRPC method name, e.g. /sieve.v1.SchedulerService/RequeueDeadLetters
    method      text        NOT NULL,
    -- what it applied to: the request as compact JSON (filters, ids), or "task <id>" for a cross-tenant access
    target      text        NOT NULL DEFAULT '',
    -- whose data a cross-tenant access touched (the task's caller)
    tenant      text,
    -- the caller's address as gRPC reports it (context.peer(), e.g. ipv4:10.0.0.7:51234)
    peer        text        NOT NULL DEFAULT '',
    -- the status the call ended with: OK, INVALID_ARGUMENT, PERMISSION_DENIED, ...
    outcome     text        NOT NULL,
    -- the status message of a call that did not end OK (truncated)
    detail      text        NOT NULL DEFAULT '',
    duration_ms real        NOT NULL DEFAULT 0
);

-- listing newest first, and pages of it: ORDER BY at DESC, id DESC with a (at, id) < (...) bound
CREATE INDEX audit_events_at ON audit_events (at, id);
-- "what did this principal do"
CREATE INDEX audit_events_principal_at ON audit_events (principal, at, id);
