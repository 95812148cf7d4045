CREATE TABLE jobs (
    id SERIAL PRIMARY KEY,
    payload TEXT NOT NULL,
    done BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE TABLE job_runs (
    id SERIAL PRIMARY KEY,
    job_id INTEGER NOT NULL REFERENCES jobs (id),
    worker TEXT NOT NULL
);
CREATE INDEX job_runs_job_id ON job_runs (job_id);
CREATE TABLE outbox (
    id SERIAL PRIMARY KEY,
    topic TEXT NOT NULL,
    payload TEXT NOT NULL,
    sent BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE TABLE published (
    outbox_id INTEGER PRIMARY KEY REFERENCES outbox (id),
    relay TEXT NOT NULL
);
