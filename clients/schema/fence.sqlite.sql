-- Ticketing fencing table, SQLite (3.24+ for the upsert).
-- One row per (domain, key): the highest fencing token that has written.
-- domain: the token sequence: the cluster's fencing domain, INFO's domain
--         field (not the cluster id; tokens of two domains are not
--         comparable; clients/FENCING.md); key: the lock key.
-- token:  the u64 token stored as token XOR 2^63 (= token - 2^63) in a
--         signed 64-bit INTEGER, which keeps the order of all u64 values.
CREATE TABLE IF NOT EXISTS ticketing_fence (
    domain TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    token  INTEGER NOT NULL,
    PRIMARY KEY (domain, key)
) WITHOUT ROWID;
