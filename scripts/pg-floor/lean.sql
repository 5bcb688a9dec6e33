-- current.sql with less written per document (a design the store does not
-- have): the content inline in the document row (no content payload row
-- written and deleted), and the events' block as one opaque body without
-- the per-column arrays and their GIN indexes.
-- scripts/pg-floor.sh
\set n random(1, 2000000000)
BEGIN;
INSERT INTO documents (id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time, content_payload, result_payload, result_content_type, dispatch_attempts, private, body, owner, lease_epoch, lease_expires, content)
 SELECT 'd' || :client_id || '-' || :n || '-' || g, 'acme', 1, false, 1, 'req' || :n || g, '\x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20'::bytea, (extract(epoch from now())*1e9)::bigint, 0, false, false, '', 0, NULL, decode(repeat('0a1b2c3d', 40), 'hex'), 'replica-1', 1, now() + interval '10 s', (SELECT b FROM floor_blob4k) FROM generate_series(1,8) g;
WITH m AS (UPDATE meta SET last_seq = last_seq + 16, event_count = event_count + 16, event_bytes = event_bytes + 2000 WHERE id = 1 RETURNING last_seq)
 INSERT INTO floor_event_blocks SELECT m.last_seq - 15, m.last_seq, decode(repeat('0a1b2c3d', 30*16), 'hex') FROM m;
SELECT pg_notify('pipestream_events', 'x');
COMMIT;
BEGIN;
UPDATE documents SET state = 4, terminal = true, rev = 6, update_time = 1, content_payload = false, result_payload = true, body = decode(repeat('0a1b2c3e', 42), 'hex'), content = NULL WHERE id IN (SELECT 'd' || :client_id || '-' || :n || '-' || g FROM generate_series(1,8) g) AND tenant = 'acme';
INSERT INTO entities SELECT 'd' || :client_id || '-' || :n || '-' || g, 1, 0, 0, 1, 0, 0, 4, 0, 0, 4096, 'abc', 1, '' FROM generate_series(1,8) g;
INSERT INTO payloads (doc_id, kind, body) SELECT 'd' || :client_id || '-' || :n || '-' || g, 2, (SELECT b FROM floor_blob4k) FROM generate_series(1,8) g;
WITH m AS (UPDATE meta SET last_seq = last_seq + 32, event_count = event_count + 32, event_bytes = event_bytes + 4000 WHERE id = 1 RETURNING last_seq)
 INSERT INTO floor_event_blocks SELECT m.last_seq - 31, m.last_seq, decode(repeat('0a1b2c3d', 30*32), 'hex') FROM m;
SELECT pg_notify('pipestream_events', 'x');
COMMIT;
