DROP TABLE reservations;
DROP TABLE stock;
DROP TABLE orders;
