-- A key may expire: expires_at is unix microseconds, NULL for a key that
-- never expires (every key made before this migration). An expired key is
-- refused like a revoked one, but its holder is told that it expired and
-- when, and an edit can extend it.
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
