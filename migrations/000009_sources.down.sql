DROP FUNCTION IF EXISTS converge_source_changed() CASCADE;
DROP FUNCTION IF EXISTS converge_source_truncate() CASCADE;
DROP TABLE IF EXISTS converge_mapped_rows;
DELETE FROM converge_inbox WHERE source IS NOT NULL;
ALTER TABLE converge_inbox
    DROP CONSTRAINT IF EXISTS converge_inbox_kind,
    DROP COLUMN IF EXISTS source,
    DROP COLUMN IF EXISTS row_id,
    ALTER COLUMN key SET NOT NULL,
    ALTER COLUMN document SET NOT NULL;
