ALTER TABLE orders DROP COLUMN basket_id;
