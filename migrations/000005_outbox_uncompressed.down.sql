ALTER TABLE outbox RESET (toast_tuple_target);
