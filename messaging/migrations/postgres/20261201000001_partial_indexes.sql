-- Most messages have no identity and no group. Indexing only the rows that
-- have one means a lease or a completion of such a row (an UPDATE that cannot
-- be HOT, since its status changes) writes two index entries instead of four.

ALTER TABLE messaging_messages DROP CONSTRAINT messaging_messages_identity;
-- At most one row per (queue, identity); conflicts name this predicate:
-- ON CONFLICT (queue, identity) WHERE identity IS NOT NULL.
CREATE UNIQUE INDEX messaging_messages_identity ON messaging_messages (queue, identity)
    WHERE identity IS NOT NULL;

DROP INDEX messaging_messages_groups;
-- FIFO group heads (every message of a FIFO queue has a group).
CREATE INDEX messaging_messages_groups ON messaging_messages (queue, group_id, seq)
    WHERE group_id IS NOT NULL AND status IN ('pending', 'sleeping', 'processing', 'awaiting_release');
