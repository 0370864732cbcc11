-- Konduit schema, version 49: an attempt's log records may be sealed by a payload codec.
--
-- What a handler logs often carries its payloads' data (an input's fields, a customer's
-- address), so under a codec the records of an attempt are sealed as one payload
-- (docs/payload-codecs.md): the column then holds an envelope, a jsonb object, where it held
-- the array of records. The check allows both; nothing in SQL looks inside the records. The
-- new check is added NOT VALID: every row already there is an array (the old check held), so
-- the migration does not read the table under its lock.
ALTER TABLE konduit_attempt_logs DROP CONSTRAINT konduit_attempt_logs_records_check;
ALTER TABLE konduit_attempt_logs ADD CONSTRAINT konduit_attempt_logs_records_check
    CHECK (jsonb_typeof(records) IN ('array', 'object')) NOT VALID;
