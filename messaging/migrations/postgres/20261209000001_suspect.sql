-- Crash isolation. A consumer that dies (an abort, a segfault, the OOM
-- killer, SIGKILL) lets every lease it held run out, and nothing tells the
-- message that killed it from the others it held. A row whose lease ran out
-- becomes a suspect: 0 none, 1 a suspect (its lease ran out while its
-- consumer held other messages too; that attempt was given back), 2 a
-- suspect whose handler runs alone in its process now (if this lease runs
-- out, the attempt counts). The worker runs a suspect with nothing else
-- running in its process; the mark is cleared when its handler answers.
-- A constant default: no rewrite of the table.
ALTER TABLE messaging_messages ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0;
