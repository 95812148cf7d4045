DROP TABLE published;
DROP TABLE outbox;
DROP TABLE job_runs;
DROP TABLE jobs;
