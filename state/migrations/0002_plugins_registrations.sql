-- Plugin uploads (content-addressed blobs, and each tenant's names for
-- them) and model registrations.
CREATE TABLE plugin_blobs (
    digest TEXT PRIMARY KEY,
    bytes BYTEA NOT NULL,
    size BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE plugins (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    digest TEXT NOT NULL REFERENCES plugin_blobs (digest),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
CREATE TABLE registrations (
    name TEXT PRIMARY KEY,
    record JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
