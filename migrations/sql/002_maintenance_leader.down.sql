-- Back to every runner running every maintenance scan.
DROP TABLE {schema}.maintenance_leader;
