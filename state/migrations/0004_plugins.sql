-- Tenant plugins, one copy for every replica: uploaded bytes once per
-- SHA-256, each tenant's names for them, and the versions of deleted
-- signed plugins (so a name cannot be rolled back). A gateway re-hashes
-- every blob it reads; the database is not trusted with the bytes. 0002's
-- two tables were never written by any gateway.
DROP TABLE plugins;
DROP TABLE plugin_blobs;

-- 8 MiB: plugin-host's MAX_COMPONENT_BYTES.
CREATE TABLE plugin_blobs (
    digest TEXT PRIMARY KEY CHECK (digest ~ '^[0-9a-f]{64}$'),
    bytes BYTEA NOT NULL CHECK (octet_length(bytes) BETWEEN 1 AND 8388608)
);

-- Versions are unsigned 64-bit numbers: NUMERIC(20), read and written as
-- text by the gateway.
CREATE TABLE plugin_entries (
    tenant TEXT NOT NULL CHECK (tenant ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name TEXT NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    digest TEXT NOT NULL REFERENCES plugin_blobs (digest),
    size_bytes BIGINT NOT NULL CHECK (size_bytes BETWEEN 1 AND 8388608),
    created_at BIGINT NOT NULL CHECK (created_at >= 0),
    uploaded_by TEXT CHECK (octet_length(uploaded_by) <= 256),
    version NUMERIC(20) CHECK (version BETWEEN 0 AND 18446744073709551615),
    PRIMARY KEY (tenant, name)
);
-- A blob's last entry gone: found by digest.
CREATE INDEX plugin_entries_digest ON plugin_entries (digest);

CREATE TABLE plugin_version_floors (
    tenant TEXT NOT NULL CHECK (tenant ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name TEXT NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    version NUMERIC(20) NOT NULL CHECK (version BETWEEN 0 AND 18446744073709551615),
    PRIMARY KEY (tenant, name)
);
