-- lockkit transactional outbox and inbox (see lockkit::outbox).
-- The outbox: one row per message, written in the transaction of the change it
-- announces; a relay publishes it and sets published_at.
CREATE TABLE lockkit_outbox (
    id BIGSERIAL PRIMARY KEY,
    topic VARCHAR(255) NOT NULL,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error TEXT,
    published_at BIGINT
);
CREATE INDEX lockkit_outbox_pending ON lockkit_outbox (id) WHERE published_at IS NULL;
-- The inbox: one row per message a consumer has applied, written in the
-- transaction of the message's effect.
CREATE TABLE lockkit_inbox (
    consumer VARCHAR(255) NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
