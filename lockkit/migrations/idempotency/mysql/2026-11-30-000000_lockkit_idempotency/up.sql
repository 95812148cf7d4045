-- lockkit idempotency keys: one row per client key (see lockkit::idempotency).
-- The key is compared byte for byte: VARCHAR's default collation would make
-- "order-abc", "ORDER-ABC" and "order-abc " the same key.
CREATE TABLE lockkit_idempotency_keys (
    idempotency_key VARBINARY(1020) PRIMARY KEY,
    fingerprint VARCHAR(255) NOT NULL,
    state VARCHAR(16) NOT NULL,
    response TEXT,
    started_at BIGINT NOT NULL,
    finished_at BIGINT
) ENGINE = InnoDB;
