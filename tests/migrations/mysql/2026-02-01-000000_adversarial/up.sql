-- A table whose declared key is not unique in the database (no constraint).
CREATE TABLE twins (
    id INTEGER NOT NULL,
    label VARCHAR(255) NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
) ENGINE = InnoDB;
-- A string key, under the server's default (case-insensitive) collation.
CREATE TABLE sku_codes (
    code VARCHAR(64) PRIMARY KEY,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
) ENGINE = InnoDB;
