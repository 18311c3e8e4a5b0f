-- PostgreSQL's variant of 0007_key_expiry.sql.
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
