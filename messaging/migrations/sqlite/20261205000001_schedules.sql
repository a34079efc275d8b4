-- The ledger of recurring messages (#[messaging::schedule]): per schedule,
-- the last tick whose turn is over (published or skipped), the last one that
-- published a message, the claim of a tick being built (claim_*: its tick,
-- the claimant's token, when the claim ends) and the pause flag. A tick's
-- message is written in the transaction that moves last_tick, so a tick is
-- published once across processes.
CREATE TABLE messaging_schedules (
    name           TEXT PRIMARY KEY,
    last_tick      BIGINT NOT NULL,
    last_published BIGINT NULL,
    paused         BOOLEAN NOT NULL DEFAULT 0,
    claim_tick     BIGINT NULL,
    claim_token    BIGINT NULL,
    claim_expires  BIGINT NULL,
    updated_at     BIGINT NOT NULL
);
