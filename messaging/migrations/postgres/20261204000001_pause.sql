-- A paused queue is leased by no process: every worker reads the flag at
-- least once per poll interval and receives nothing while it is set.
ALTER TABLE messaging_queues ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE;
