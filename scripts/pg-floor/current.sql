-- The rows the PostgreSQL store writes for 8 small (4 KiB) documents, with
-- ideal batching: one multi-row statement per table, two transactions
-- (create; terminal update), 6 events per document, the events of a
-- transaction as one event_blocks row (schema migration 4). scripts/pg-floor.sh
\set n random(1, 2000000000)
BEGIN;
INSERT INTO documents (id, tenant, state, terminal, rev, request_id, body_hash, create_time, update_time, content_payload, result_payload, result_content_type, dispatch_attempts, private, body, owner, lease_epoch, lease_expires)
 SELECT 'd' || :client_id || '-' || :n || '-' || g, 'acme', 1, false, 1, 'req' || :n || g, '\x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20'::bytea, (extract(epoch from now())*1e9)::bigint, 0, false, false, '', 0, NULL, decode(repeat('0a1b2c3d', 40), 'hex'), 'replica-1', 1, now() + interval '10 s' FROM generate_series(1,8) g;
INSERT INTO payloads (doc_id, kind, body) SELECT 'd' || :client_id || '-' || :n || '-' || g, 1, (SELECT b FROM floor_blob4k) FROM generate_series(1,8) g;
WITH m AS (UPDATE meta SET last_seq = last_seq + 16, event_count = event_count + 16, event_bytes = event_bytes + 2000 WHERE id = 1 RETURNING last_seq)
 INSERT INTO event_blocks SELECT m.last_seq - 15, m.last_seq, array_agg(0::bigint), array_agg('status'::text), array_agg('acme'::text), array_agg('d' || :client_id || '-' || :n || '-' || (g % 8)), array_agg(1::bigint), array_agg(0::bigint), array_agg(120), array_agg(decode(repeat('0a1b2c3d', 30), 'hex')) FROM m, generate_series(1,16) g GROUP BY m.last_seq;
SELECT pg_notify('pipestream_events', 'x');
COMMIT;
BEGIN;
UPDATE documents SET state = 4, terminal = true, rev = 6, update_time = 1, content_payload = false, result_payload = true, body = decode(repeat('0a1b2c3e', 42), 'hex') WHERE id IN (SELECT 'd' || :client_id || '-' || :n || '-' || g FROM generate_series(1,8) g) AND tenant = 'acme';
INSERT INTO entities SELECT 'd' || :client_id || '-' || :n || '-' || g, 1, 0, 0, 1, 0, 0, 4, 0, 0, 4096, 'abc', 1, '' FROM generate_series(1,8) g;
INSERT INTO payloads (doc_id, kind, body) SELECT 'd' || :client_id || '-' || :n || '-' || g, 2, (SELECT b FROM floor_blob4k) FROM generate_series(1,8) g;
DELETE FROM payloads WHERE doc_id IN (SELECT 'd' || :client_id || '-' || :n || '-' || g FROM generate_series(1,8) g) AND kind = 1;
WITH m AS (UPDATE meta SET last_seq = last_seq + 32, event_count = event_count + 32, event_bytes = event_bytes + 4000 WHERE id = 1 RETURNING last_seq)
 INSERT INTO event_blocks SELECT m.last_seq - 31, m.last_seq, array_agg(0::bigint), array_agg('status'::text), array_agg('acme'::text), array_agg('d' || :client_id || '-' || :n || '-' || (g % 8)), array_agg(1::bigint), array_agg(0::bigint), array_agg(120), array_agg(decode(repeat('0a1b2c3d', 30), 'hex')) FROM m, generate_series(1,32) g GROUP BY m.last_seq;
SELECT pg_notify('pipestream_events', 'x');
COMMIT;
