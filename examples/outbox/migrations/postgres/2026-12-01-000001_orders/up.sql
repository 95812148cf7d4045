-- The order service's table, and the stock service's. `reservations` has no
-- unique key on order_id on purpose: a message applied twice would show as two rows.
CREATE TABLE orders (id SERIAL PRIMARY KEY, item_id INTEGER NOT NULL, qty INTEGER NOT NULL);
CREATE TABLE stock (item_id INTEGER PRIMARY KEY, reserved INTEGER NOT NULL DEFAULT 0);
CREATE TABLE reservations (id SERIAL PRIMARY KEY, order_id INTEGER NOT NULL, qty INTEGER NOT NULL);
