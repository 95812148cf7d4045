-- A table whose declared key is not unique in the database (no constraint).
CREATE TABLE twins (
    id INTEGER NOT NULL,
    label TEXT NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
-- A string key.
CREATE TABLE sku_codes (
    code VARCHAR(64) PRIMARY KEY,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
