-- The audit log: entries by index with their Merkle leaf hash, the head
-- (the row an append locks FOR UPDATE to serialize appends across
-- replicas), and the signed checkpoints.
CREATE TABLE audit_entries (
    idx BIGINT PRIMARY KEY CHECK (idx >= 0),
    entry BYTEA NOT NULL,
    leaf BYTEA NOT NULL CHECK (length(leaf) = 32),
    appended_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE audit_head (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    size BIGINT NOT NULL CHECK (size >= 0)
);
INSERT INTO audit_head (size) VALUES (0);
CREATE TABLE audit_checkpoints (
    size BIGINT PRIMARY KEY CHECK (size >= 0),
    note TEXT NOT NULL,
    signed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
