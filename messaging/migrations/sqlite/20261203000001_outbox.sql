-- The outbox: messages published inside an application's transaction for a
-- queue on another transport (Amazon SQS, for one). A relay claims rows for a
-- while (lease_token, lease_expires), sends them, then deletes them. Rows of
-- one FIFO group leave in id order: a row is claimed only when no earlier row
-- of its group is claimed or waiting for a retry.
CREATE TABLE messaging_outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue         TEXT NOT NULL,
    message_id    TEXT NOT NULL,
    fifo          INTEGER NOT NULL,
    group_id      TEXT NULL,
    dedup_id      TEXT NULL,
    identity      TEXT NULL,
    payload       BLOB NOT NULL,
    attributes    TEXT NOT NULL DEFAULT '',
    priority      INTEGER NOT NULL DEFAULT 0,
    delay_ms      BIGINT NULL,
    created_at    BIGINT NOT NULL,
    -- 'pending' until sent; 'failed' when the transport refused it for good.
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_at       BIGINT NOT NULL,
    lease_token   BIGINT NULL,
    lease_expires BIGINT NULL,
    error         TEXT NULL
);
-- What a relay claims: a queue's pending rows in order.
CREATE INDEX messaging_outbox_pending ON messaging_outbox (queue, id) WHERE status = 'pending';
-- The earlier rows of a FIFO group.
CREATE INDEX messaging_outbox_groups ON messaging_outbox (queue, group_id, id) WHERE fifo AND status = 'pending';
