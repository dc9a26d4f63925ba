"""Narrow interfaces and wire types shared by the subsystems (scheduler, engines, inference, rollout).

Modules here import no torch at module level, so that configuration, CLI and DAG code can use the
types freely.
"""
