#!/usr/bin/env bash
# Postgres init script (mounted into /docker-entrypoint-initdb.d by docker-compose.yaml): creates the
# `mlflow` role and database beside the `airflow` ones the image creates from POSTGRES_USER/POSTGRES_DB.
# The image runs it once, on the first start with an empty data volume; changing MLFLOW_DB_PASSWORD
# later needs `ALTER ROLE mlflow PASSWORD ...` (docs/operations.md).
set -Eeo pipefail  # what the image's entrypoint uses: the script may be sourced, not run

: "${MLFLOW_DB_PASSWORD:?set MLFLOW_DB_PASSWORD}"

# The password travels as a psql variable (:'pw' quotes it as a literal), never spliced into the SQL.
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -v pw="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE mlflow LOGIN PASSWORD :'pw';
CREATE DATABASE mlflow OWNER mlflow;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
SQL
