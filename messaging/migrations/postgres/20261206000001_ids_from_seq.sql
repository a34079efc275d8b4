-- A message's id is drawn from messaging_seq with its enqueue order: every
-- insert writes the one value to both `id` and `seq`, where the column's own
-- sequence (BIGSERIAL) cost each row a second draw. The default follows, for
-- rows written by hand, and the sequence moves past every id already given
-- (the table is locked by the ALTER, so no insert comes between).
ALTER TABLE messaging_messages ALTER COLUMN id SET DEFAULT nextval('messaging_seq');
SELECT setval('messaging_seq', GREATEST(
    (SELECT last_value FROM messaging_seq),
    (SELECT last_value FROM messaging_messages_id_seq),
    (SELECT COALESCE(max(id), 1) FROM messaging_messages)));
DROP SEQUENCE messaging_messages_id_seq;
