DROP TABLE orders;
DROP TABLE items;
