# syntax=docker/dockerfile:1
# The MLflow tracking server of docker-compose.yaml: MLflow with the Postgres driver (backend store)
# and boto3 (s3:// artifacts, served through the server with --serve-artifacts).
#
#   docker build -f docker/mlflow.Dockerfile -t areal-tasks-mlflow:latest docker/
#
# A server image of its own, apart from the Airflow image: it needs none of torch or Airflow. Keep
# MLFLOW_VERSION equal to the client version the tasks use.
FROM python:3.11-slim-bookworm

ARG MLFLOW_VERSION=3.17.2
ARG PSYCOPG2_VERSION=2.9.13
ARG BOTO3_VERSION=1.44.8

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

RUN pip install \
        "mlflow==${MLFLOW_VERSION}" \
        "psycopg2-binary==${PSYCOPG2_VERSION}" \
        "boto3==${BOTO3_VERSION}" \
    && useradd --create-home --uid 1000 mlflow

USER mlflow
WORKDIR /home/mlflow
EXPOSE 5000
CMD ["mlflow", "server", "--host=0.0.0.0", "--port=5000"]
