DROP TABLE sku_codes; DROP TABLE twins;
