ALTER TABLE documents DROP COLUMN meta_text;
