DROP TABLE lockkit_fences;
DROP TABLE lockkit_leases;
