-- The status check, written as comparisons rather than `status IN (…)`.
-- SQLite evaluates a table's CHECK for every row an INSERT writes and every
-- row an UPDATE of `status` changes, and a six-value IN list there cost
-- about a microsecond per row. In SQLite alone (3.40, 20,000 rows, 1,000 per
-- statement, CPU time, medians of five runs) an insert of the framework's
-- shape took 1.98 us per row with the list and 1.08 with the comparisons,
-- a lease (the UPDATE to 'processing') 6.5 and 5.4. Through the framework
-- (50,000 messages, five interleaved runs, medians): `send_batch` 213,000
-- -> 309,000 msgs/s (4.8 -> 3.2 us of CPU per message), a drain at
-- concurrency 1 65,800 -> 77,500. The partial indexes' two- and four-value
-- lists measured the same either way and stay as they are (their queries
-- name them word for word, which is how SQLite knows it may use them).
--
-- A CHECK cannot be changed in place, so the table is rebuilt as
-- 20261207000001_partial_identity.sql did: rows, ids and the AUTOINCREMENT
-- high-water mark kept, every index made again.

CREATE TABLE messaging_messages_rebuilt (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    queue                TEXT NOT NULL,
    identity             TEXT NULL,
    group_id             TEXT NULL,
    message_id           TEXT NOT NULL,
    payload              BLOB NOT NULL,
    attributes           TEXT NOT NULL DEFAULT '',
    priority             INTEGER NOT NULL DEFAULT 0,
    process_at           BIGINT NULL,
    status               TEXT NOT NULL CHECK (status = 'pending' OR status = 'sleeping'
                           OR status = 'processing' OR status = 'awaiting_release'
                           OR status = 'error' OR status = 'processed'),
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
    errors               TEXT NOT NULL DEFAULT ''
);

INSERT INTO messaging_messages_rebuilt (id, queue, identity, group_id, message_id, payload, attributes, priority,
    process_at, status, attempts, seq, lease_token, lease_expires, deferred_message_id, deferred_payload,
    deferred_attributes, deferred_priority, deferred_process_at, deferred_status, deferred_seq, deferred_sent_at,
    sent_at, processed_at, error, errors)
SELECT id, queue, identity, group_id, message_id, payload, attributes, priority,
    process_at, status, attempts, seq, lease_token, lease_expires, deferred_message_id, deferred_payload,
    deferred_attributes, deferred_priority, deferred_process_at, deferred_status, deferred_seq, deferred_sent_at,
    sent_at, processed_at, error, errors
FROM messaging_messages;

-- The copy recorded its largest id; the old table may have given larger ones
-- (to rows since deleted).
DELETE FROM sqlite_sequence WHERE name = 'messaging_messages_rebuilt';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'messaging_messages_rebuilt', max(seq) FROM (
    SELECT seq FROM sqlite_sequence WHERE name = 'messaging_messages'
    UNION ALL SELECT max(id) FROM messaging_messages_rebuilt
) HAVING max(seq) IS NOT NULL;

DROP TABLE messaging_messages;
ALTER TABLE messaging_messages_rebuilt RENAME TO messaging_messages;

-- At most one row per (queue, identity), among the rows that have one.
CREATE UNIQUE INDEX messaging_messages_identity ON messaging_messages (queue, identity) WHERE identity IS NOT NULL;
-- Leasing takes the first pending rows by priority, then enqueue order.
CREATE INDEX messaging_messages_ready ON messaging_messages (queue, priority DESC, seq) WHERE status = 'pending';
-- Sleeping rows wake up by process-at.
CREATE INDEX messaging_messages_sleeping ON messaging_messages (queue, process_at) WHERE status = 'sleeping';
-- Leases expire by lease_expires.
CREATE INDEX messaging_messages_leased ON messaging_messages (queue, lease_expires)
    WHERE status IN ('processing', 'awaiting_release');
-- Dead letters in order.
CREATE INDEX messaging_messages_error ON messaging_messages (queue, seq) WHERE status = 'error';
-- FIFO group heads (every message of a FIFO queue has a group).
CREATE INDEX messaging_messages_groups ON messaging_messages (queue, group_id, seq)
    WHERE group_id IS NOT NULL AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release');
-- Retained processed rows, pruned by age.
CREATE INDEX messaging_messages_processed ON messaging_messages (queue, processed_at) WHERE status = 'processed';
