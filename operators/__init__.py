"""Airflow provider-shaped code for areal-tasks: hooks, operators, triggers and one exception module.

Operators reach ``areal_tasks`` only inside ``execute()`` and triggers, never at import time, so the
DAG processor parses DAG files without importing torch. Filled in by the orchestration issue.
"""
