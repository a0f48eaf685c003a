DROP TABLE {schema}.tasks;
DROP SEQUENCE {schema}.task_settle_seq;
DROP SEQUENCE {schema}.task_token_seq;
DROP TABLE {schema}.conversations;
