-- lockkit idempotency keys: one row per client key of each principal (see
-- lockkit::idempotency). The same key from two principals is two keys.
CREATE TABLE lockkit_idempotency_keys (
    principal VARCHAR(255) NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    fingerprint VARCHAR(255) NOT NULL,
    state VARCHAR(16) NOT NULL,
    response TEXT,
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (principal, idempotency_key)
);
