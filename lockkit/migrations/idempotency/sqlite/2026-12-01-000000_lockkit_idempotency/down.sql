DROP TABLE lockkit_idempotency_keys;
