CREATE TABLE items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE gadgets (
    id INTEGER PRIMARY KEY,
    label TEXT NOT NULL,
    version SMALLINT NOT NULL DEFAULT 0
);
CREATE TABLE documents (
    id BIGINT PRIMARY KEY,
    title TEXT NOT NULL,
    note TEXT,
    lock_version BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE order_lines (
    order_id INTEGER NOT NULL,
    line_no INTEGER NOT NULL,
    qty INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (order_id, line_no)
);
