-- The error history of each message: its last failed attempts, as a JSON
-- array of {attempt, at_ms, type, message} ('' for none).
ALTER TABLE messaging_messages ADD COLUMN errors TEXT NOT NULL DEFAULT '';
