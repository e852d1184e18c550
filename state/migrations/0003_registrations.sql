-- Model registrations made through the admin API, one row per model. The
-- record is the JSON the file store keeps (claim and signature bundle),
-- as text: the bundle is verified by every replica from these bytes, so
-- the database must not rewrite them (JSONB would). 0002's table was
-- never written by any gateway.
DROP TABLE registrations;
CREATE TABLE registrations (
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
