DROP TABLE order_lines; DROP TABLE documents; DROP TABLE gadgets; DROP TABLE items;
