-- Runs once, on the first start of an empty postgres volume (docker-entrypoint-initdb.d).
-- POSTGRES_DB creates `hoprl` (the run registry); the Prefect server keeps its state apart.
CREATE DATABASE prefect OWNER hoprl;
