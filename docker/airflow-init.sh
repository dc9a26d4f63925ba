#!/usr/bin/env bash
# One-shot init of the Airflow deployment (the `airflow-init` service of docker-compose.yaml):
# migrate the metadata database (Airflow's tables and the FAB auth manager's), then create the
# admin user if it does not exist yet. Safe to run again: both steps are idempotent.
set -euo pipefail

: "${AIRFLOW_ADMIN_USERNAME:?set AIRFLOW_ADMIN_USERNAME}"
: "${AIRFLOW_ADMIN_PASSWORD:?set AIRFLOW_ADMIN_PASSWORD}"
: "${AIRFLOW_ADMIN_EMAIL:=admin@example.org}"

echo "airflow-init: migrating the metadata database"
airflow db migrate

# `users create` leaves an existing user as it is (it prints "... already exists" and exits 0);
# change a password with `airflow users reset-password`.
echo "airflow-init: admin user ${AIRFLOW_ADMIN_USERNAME}"
airflow users create \
    --username "${AIRFLOW_ADMIN_USERNAME}" \
    --password "${AIRFLOW_ADMIN_PASSWORD}" \
    --firstname Admin \
    --lastname User \
    --role Admin \
    --email "${AIRFLOW_ADMIN_EMAIL}"

echo "airflow-init: done"
