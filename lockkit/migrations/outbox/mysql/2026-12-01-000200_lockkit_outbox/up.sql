-- lockkit transactional outbox and inbox (see lockkit::outbox).
-- The outbox: one row per message, written in the transaction of the change it
-- announces; a relay publishes it and sets published_at.
CREATE TABLE lockkit_outbox (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    topic VARCHAR(255) NOT NULL,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error TEXT,
    published_at BIGINT,
    -- The claim reads unpublished rows in id order and stops at its LIMIT. An
    -- index MySQL had to sort would lock every pending row, and SKIP LOCKED
    -- would then leave the other relays nothing.
    INDEX lockkit_outbox_pending (published_at, id)
) ENGINE = InnoDB;
-- The inbox: one row per message a consumer has applied, written in the
-- transaction of the message's effect. Names are compared byte for byte:
-- VARCHAR's default collation would make "m-1" and "M-1 " the same message.
CREATE TABLE lockkit_inbox (
    consumer VARBINARY(1020) NOT NULL,
    message_id VARBINARY(1020) NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
) ENGINE = InnoDB;
