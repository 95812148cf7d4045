CREATE TABLE items (
    id INTEGER PRIMARY KEY AUTO_INCREMENT,
    name VARCHAR(255) NOT NULL,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
) ENGINE = InnoDB;
CREATE TABLE gadgets (
    id INTEGER PRIMARY KEY,
    label VARCHAR(255) NOT NULL,
    version SMALLINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;
CREATE TABLE documents (
    id BIGINT PRIMARY KEY,
    title VARCHAR(255) NOT NULL,
    note TEXT,
    lock_version BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;
CREATE TABLE order_lines (
    order_id INTEGER NOT NULL,
    line_no INTEGER NOT NULL,
    qty INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (order_id, line_no)
) ENGINE = InnoDB;
