package fence

// Schema returns the DDL of DefaultTable for dialect d; it is the content of
// clients/schema/fence.<dialect>.sql (a test keeps them identical). Every
// statement is idempotent (IF NOT EXISTS / OR REPLACE).
func Schema(d Dialect) string {
	if d == Postgres {
		return schemaPostgres
	}
	return schemaSQLite
}

const schemaSQLite = `-- Ticketing fencing table, SQLite (3.24+ for the upsert).
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
`

const schemaPostgres = `-- Ticketing fencing table, PostgreSQL (9.5+ for ON CONFLICT).
-- One row per (domain, key): the highest fencing token that has written.
-- domain: the token sequence: the cluster's fencing domain, INFO's domain
--         field (not the cluster id; tokens of two domains are not
--         comparable; clients/FENCING.md); key: the lock key.
-- token:  the u64 token stored as token XOR 2^63 (= token - 2^63) in a
--         BIGINT, which keeps the order of all u64 values (PostgreSQL has
--         no unsigned 64-bit type). The view shows the real token.
CREATE TABLE IF NOT EXISTS ticketing_fence (
    domain TEXT   NOT NULL,
    key    TEXT   NOT NULL,
    token  BIGINT NOT NULL,
    PRIMARY KEY (domain, key)
);

CREATE OR REPLACE VIEW ticketing_fence_tokens AS
    SELECT domain, key, token::numeric + 9223372036854775808 AS token
    FROM ticketing_fence;
`
