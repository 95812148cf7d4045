-- A UUID key, for `lock_all` with the `uuid` feature (PostgreSQL only: Diesel
-- maps UUIDs on no other backend).
CREATE TABLE tickets (
    id UUID PRIMARY KEY,
    title TEXT NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
