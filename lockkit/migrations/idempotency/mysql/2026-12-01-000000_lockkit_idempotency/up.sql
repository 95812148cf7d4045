-- lockkit idempotency keys: one row per client key of each principal (see
-- lockkit::idempotency). The same key from two principals is two keys.
-- Principal and key are compared byte for byte: VARCHAR's default collation
-- would make "order-abc", "ORDER-ABC" and "order-abc " the same key.
CREATE TABLE lockkit_idempotency_keys (
    principal VARBINARY(1020) NOT NULL,
    idempotency_key VARBINARY(1020) NOT NULL,
    fingerprint VARCHAR(255) NOT NULL,
    state VARCHAR(16) NOT NULL,
    response TEXT,
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (principal, idempotency_key)
) ENGINE = InnoDB;
