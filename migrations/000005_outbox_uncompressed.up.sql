-- An outbox row is written once, read once by the relay's logical
-- decoding and deleted by retention: compressing its payload cost the
-- writer's backend more CPU (pglz) than any other single function, and the
-- walsender decompressed it again for every event. Rows up to the maximum
-- target (8160 bytes, nearly a page) are now stored as written; larger
-- payloads are still compressed or moved out of line as before.
ALTER TABLE outbox SET (toast_tuple_target = 8160);
