-- utf8mb4 whatever the database's default: a name in any script fits (a
-- `latin1` default refuses an emoji, which the API would answer with a 500).
CREATE TABLE items (
    id INTEGER PRIMARY KEY AUTO_INCREMENT,
    name VARCHAR(255) NOT NULL,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
