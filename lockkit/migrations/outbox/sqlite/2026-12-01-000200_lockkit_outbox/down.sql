DROP TABLE lockkit_inbox;
DROP TABLE lockkit_outbox;
