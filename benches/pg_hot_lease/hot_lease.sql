-- The PostgreSQL lease, measured in the server alone (`run.py` loads this
-- into a scratch database holding the framework's migrations): what a lease
-- and its completion cost as the framework writes them today, against a
-- lease that changes no indexed column (a heap-only update), against the
-- raw baseline's `DELETE … FOR UPDATE SKIP LOCKED`. docs/PERFORMANCE.md
-- records what it found.

ALTER TABLE messaging_messages ADD COLUMN IF NOT EXISTS leased_until BIGINT NULL;
DROP TABLE IF EXISTS hot70, hot100, raw;
CREATE TABLE hot70 (LIKE messaging_messages INCLUDING ALL) WITH (fillfactor = 70);
CREATE TABLE hot100 (LIKE messaging_messages INCLUDING ALL);
CREATE TABLE raw (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL);

CREATE OR REPLACE PROCEDURE fill(tbl text, n int) LANGUAGE plpgsql AS $$
BEGIN
  IF tbl = 'raw' THEN
    EXECUTE 'INSERT INTO raw (payload) SELECT convert_to(repeat(''x'', 120), ''UTF8'') FROM generate_series(1, $1)' USING n;
  ELSE
    EXECUTE format('INSERT INTO %I (id, queue, message_id, payload, status, seq, sent_at) '
      'SELECT g, ''q'', ''id-'' || g, convert_to(repeat(''x'', 120), ''UTF8''), ''pending'', g, 0 FROM generate_series(1, $1) g', tbl) USING n;
  END IF;
END $$;

-- The framework's lease today: status and lease_expires change (every
-- partial index names status): a new row version and new index entries.
CREATE OR REPLACE PROCEDURE drain_now(tbl text, part int, parts int, n int) LANGUAGE plpgsql AS $$
DECLARE tuples tid[];
BEGIN
  EXECUTE format('WITH picked AS (SELECT ctid AS tuple FROM %I WHERE queue = ''q'' AND status = ''pending'' '
    'AND CASE WHEN id %% $2 = $1 THEN TRUE ELSE FALSE END ORDER BY priority DESC, seq LIMIT $3 FOR UPDATE SKIP LOCKED), '
    'l AS (UPDATE %I SET status = ''processing'', lease_token = (SELECT nextval(''messaging_seq'')), '
    'lease_expires = 9000000000000, attempts = attempts + 1 WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) '
    'AND status = ''pending'' RETURNING ctid) SELECT array_agg(ctid) FROM l', tbl, tbl) INTO tuples USING part, parts, n;
  COMMIT;
  EXECUTE format('DELETE FROM %I WHERE ctid = ANY(ARRAY(SELECT unnest($1::tid[])))', tbl) USING tuples;
  COMMIT;
END $$;

-- A lease that changes no indexed column: status stays pending, the lease
-- is a time in a column of its own; leasable rows are those whose lease
-- ended.
CREATE OR REPLACE PROCEDURE drain_hot(tbl text, part int, parts int, n int) LANGUAGE plpgsql AS $$
DECLARE tuples tid[];
BEGIN
  EXECUTE format('WITH picked AS (SELECT ctid AS tuple FROM %I WHERE queue = ''q'' AND status = ''pending'' '
    'AND (leased_until IS NULL OR leased_until < 1000) '
    'AND CASE WHEN id %% $2 = $1 THEN TRUE ELSE FALSE END ORDER BY priority DESC, seq LIMIT $3 FOR UPDATE SKIP LOCKED), '
    'l AS (UPDATE %I SET leased_until = 9000000000000, lease_token = (SELECT nextval(''messaging_seq'')), '
    'attempts = attempts + 1 WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) '
    'RETURNING ctid) SELECT array_agg(ctid) FROM l', tbl, tbl) INTO tuples USING part, parts, n;
  COMMIT;
  EXECUTE format('DELETE FROM %I WHERE ctid = ANY(ARRAY(SELECT unnest($1::tid[])))', tbl) USING tuples;
  COMMIT;
END $$;

CREATE OR REPLACE PROCEDURE drain_raw(n int) LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM raw WHERE id IN (SELECT id FROM raw ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED);
  COMMIT;
END $$;

-- Lease ahead: the next lease is taken before the previous one's rows are
-- deleted, as a worker that prefetches does, so that a lease walks over
-- rows still in flight (in the HOT form they stay in the ready index).
CREATE OR REPLACE PROCEDURE drain_ahead(kind text, tbl text, part int, parts int, n int) LANGUAGE plpgsql AS $$
DECLARE prev tid[]; cur tid[]; lease text;
BEGIN
  IF kind = 'now' THEN
    lease := format('WITH picked AS (SELECT ctid AS tuple FROM %I WHERE queue = ''q'' AND status = ''pending'' '
      'AND CASE WHEN id %% $2 = $1 THEN TRUE ELSE FALSE END ORDER BY priority DESC, seq LIMIT $3 FOR UPDATE SKIP LOCKED), '
      'l AS (UPDATE %I SET status = ''processing'', lease_token = (SELECT nextval(''messaging_seq'')), '
      'lease_expires = 9000000000000, attempts = attempts + 1 WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) '
      'AND status = ''pending'' RETURNING ctid) SELECT array_agg(ctid) FROM l', tbl, tbl);
  ELSE
    lease := format('WITH picked AS (SELECT ctid AS tuple FROM %I WHERE queue = ''q'' AND status = ''pending'' '
      'AND (leased_until IS NULL OR leased_until < 1000) '
      'AND CASE WHEN id %% $2 = $1 THEN TRUE ELSE FALSE END ORDER BY priority DESC, seq LIMIT $3 FOR UPDATE SKIP LOCKED), '
      'l AS (UPDATE %I SET leased_until = 9000000000000, lease_token = (SELECT nextval(''messaging_seq'')), '
      'attempts = attempts + 1 WHERE ctid = ANY(ARRAY(SELECT tuple FROM picked)) '
      'RETURNING ctid) SELECT array_agg(ctid) FROM l', tbl, tbl);
  END IF;
  EXECUTE lease INTO prev USING part, parts, n;
  COMMIT;
  LOOP
    EXECUTE lease INTO cur USING part, parts, n;
    COMMIT;
    EXIT WHEN prev IS NULL;
    EXECUTE format('DELETE FROM %I WHERE ctid = ANY(ARRAY(SELECT unnest($1::tid[])))', tbl) USING prev;
    COMMIT;
    prev := cur;
  END LOOP;
END $$;
