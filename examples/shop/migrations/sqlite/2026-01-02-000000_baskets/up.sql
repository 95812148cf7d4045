-- Multi-item orders: the order lines of one basket share a basket_id (NULL for
-- single-item purchases).
ALTER TABLE orders ADD COLUMN basket_id INTEGER;
