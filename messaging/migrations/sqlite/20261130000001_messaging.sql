-- The tables of the messaging framework on SQLite.
-- Times are milliseconds since the Unix epoch (BIGINT), taken from the
-- application's clock.

-- Queues declared by services, with their kind: a service declaring a queue
-- with another kind fails at startup.
CREATE TABLE messaging_queues (
    name       TEXT PRIMARY KEY,
    fifo       INTEGER NOT NULL,
    created_at BIGINT NOT NULL
);


-- One row per message; at most one per (queue, identity).
CREATE TABLE messaging_messages (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    queue                TEXT NOT NULL,
    identity             TEXT NULL,
    group_id             TEXT NULL,
    message_id           TEXT NOT NULL,
    payload              BLOB NOT NULL,
    attributes           TEXT NOT NULL DEFAULT '',
    priority             INTEGER NOT NULL DEFAULT 0,
    process_at           BIGINT NULL,
    status               TEXT NOT NULL CHECK (status IN
                           ('pending', 'sleeping', 'processing', 'awaiting_release', 'error', 'processed')),
    attempts             INTEGER NOT NULL DEFAULT 0,
    seq                  BIGINT NOT NULL,
    lease_token          BIGINT NULL,
    lease_expires        BIGINT NULL,
    deferred_message_id  TEXT NULL,
    deferred_payload     BLOB NULL,
    deferred_attributes  TEXT NULL,
    deferred_priority    INTEGER NULL,
    deferred_process_at  BIGINT NULL,
    deferred_status      TEXT NULL,
    deferred_seq         BIGINT NULL,
    deferred_sent_at     BIGINT NULL,
    sent_at              BIGINT NOT NULL,
    processed_at         BIGINT NULL,
    error                TEXT NULL,
    CONSTRAINT messaging_messages_identity UNIQUE (queue, identity)
);

-- Leasing takes the first pending rows by priority, then enqueue order.
CREATE INDEX messaging_messages_ready ON messaging_messages (queue, priority DESC, seq) WHERE status = 'pending';
-- Sleeping rows wake up by process-at.
CREATE INDEX messaging_messages_sleeping ON messaging_messages (queue, process_at) WHERE status = 'sleeping';
-- Leases expire by lease_expires.
CREATE INDEX messaging_messages_leased ON messaging_messages (queue, lease_expires)
    WHERE status IN ('processing', 'awaiting_release');
-- Dead letters in order, and FIFO group heads.
CREATE INDEX messaging_messages_error ON messaging_messages (queue, seq) WHERE status = 'error';
CREATE INDEX messaging_messages_groups ON messaging_messages (queue, group_id, seq)
    WHERE status IN ('pending', 'sleeping', 'processing', 'awaiting_release');
CREATE INDEX messaging_messages_processed ON messaging_messages (queue, processed_at) WHERE status = 'processed';

-- The last processed version of each identity (kept even with retention 0).
CREATE TABLE messaging_previous (
    queue        TEXT NOT NULL,
    identity     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    payload      BLOB NOT NULL,
    processed_at BIGINT NOT NULL,
    PRIMARY KEY (queue, identity)
);

-- Idempotency claims: one side effect per (message id, scope).
-- processor_id MUST be nullable: NULL marks an unclaimed row.
CREATE TABLE messaging_idempotency (
    message_id       TEXT NOT NULL,
    scope            TEXT NOT NULL,
    processor_id     TEXT NULL,
    lease_expires_at BIGINT NULL,
    completed        INTEGER NOT NULL DEFAULT 0,
    completed_at     BIGINT NULL,
    PRIMARY KEY (message_id, scope)
);
CREATE INDEX messaging_idempotency_completed ON messaging_idempotency (completed_at) WHERE completed = 1;

-- Enqueue order and lease tokens (SQLite has no sequences).
CREATE TABLE messaging_counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO messaging_counters (name, value) VALUES ('seq', 0);
