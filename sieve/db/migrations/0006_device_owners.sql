-- Device ownership (intake_svc/ownership.py): a device (normalised MAC) belongs to the caller that first submitted
-- for it; only that caller (and operators) may submit for it. An operator re-assigns it with AssignDevice.
-- `version` orders re-assignments: 0 for a claim by a first submit, else the next value of device_owner_version,
-- taken under a transaction-scoped advisory lock so that versions become visible in the order they were taken;
-- each intake replica reads the rows above the last version it saw (at least every SIEVE_DEVICE_OWNER_REFRESH_S)
-- and so learns of every re-assignment. Changes no other table.
CREATE SEQUENCE device_owner_version;

CREATE TABLE device_owners (
    device      text        PRIMARY KEY,
    caller      text        NOT NULL,
    -- when it was claimed, or re-assigned last
    since       timestamptz NOT NULL DEFAULT now(),
    -- the operator that re-assigned it (NULL: claimed by the caller's first submit)
    assigned_by text,
    version     bigint      NOT NULL DEFAULT 0
);

-- what each replica polls: re-assignments after the last version it saw
CREATE INDEX device_owners_reassigned ON device_owners (version) WHERE version > 0;

-- devices that already have tasks belong to the caller of their first one
INSERT INTO device_owners (device, caller, since)
SELECT DISTINCT ON (device) device, caller, created_at FROM tasks ORDER BY device, created_at, id
ON CONFLICT (device) DO NOTHING;
