DROP TABLE IF EXISTS converge_inbox;
DROP FUNCTION IF EXISTS converge_inbox_notify();
