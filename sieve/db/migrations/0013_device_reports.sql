-- Detections devices made themselves and reported (IntakeService.ReportDetection, sieve/db/reports.py): one row
-- per caller, device and the device's own report id (a repeated report finds its row). `fingerprint` is a
-- SHA-256 of what was reported, so that the same id with another report is told apart from a repeat.
CREATE TABLE device_reports (
    caller      text        NOT NULL,
    device      text        NOT NULL,
    report_id   text        NOT NULL,
    detected_at timestamptz NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    subject     text        NOT NULL CHECK (subject IN ('text', 'image_url', 'image_ref')),
    content     text        NOT NULL,
    verdict     text        NOT NULL CHECK (verdict IN ('PASS', 'REVIEW', 'BLOCK')),
    hits        jsonb       NOT NULL,
    labels      jsonb,
    fingerprint bytea       NOT NULL,
    PRIMARY KEY (caller, device, report_id)
);
CREATE INDEX device_reports_received ON device_reports (received_at);
