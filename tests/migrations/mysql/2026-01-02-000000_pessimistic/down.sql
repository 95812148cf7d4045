DROP TABLE orders; DROP TABLE doctors; DROP TABLE jobs;
