-- lockkit idempotency keys: one row per client key (see lockkit::idempotency).
CREATE TABLE lockkit_idempotency_keys (
    idempotency_key VARCHAR(255) PRIMARY KEY,
    fingerprint VARCHAR(255) NOT NULL,
    state VARCHAR(16) NOT NULL,
    response TEXT,
    started_at BIGINT NOT NULL,
    finished_at BIGINT
);
