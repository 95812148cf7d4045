-- lockkit leases (see lockkit::lease): one row per lease name, kept after a
-- release so that the name's fence only grows. expires_at is the server's clock,
-- in Unix milliseconds; owner is the holder's random token, NULL when released.
-- Names are compared byte for byte (VARBINARY): "Job" and "job " are two leases.
CREATE TABLE lockkit_leases (
    name VARBINARY(1020) PRIMARY KEY,
    owner VARCHAR(64),
    fence BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
) ENGINE = InnoDB;
-- The highest fence that fenced writes to each resource have seen
-- (see lockkit::lease::fenced): an older fence is refused.
CREATE TABLE lockkit_fences (
    resource VARBINARY(1020) PRIMARY KEY,
    fence BIGINT NOT NULL
) ENGINE = InnoDB;
