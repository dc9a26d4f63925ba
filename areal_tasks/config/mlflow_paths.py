"""Where MLflow keeps a local store's artifacts (torch-free; shared by the trainer's callback and the DAG hooks).

MLflow's default artifact root for a ``sqlite:///`` tracking store is ``./mlruns`` relative to the
working directory of whichever process creates the experiment first, so artifacts of one store
would scatter over wherever a worker, a test or a DAG task happened to run.
:func:`local_artifact_location` keeps them beside the database instead.
"""

from __future__ import annotations

from pathlib import Path


def local_artifact_location(tracking_uri: str) -> str | None:
    """For a ``sqlite:///`` store: ``file://<db folder>/mlartifacts``; None for any other store (a
    tracking server or a file store chooses its own artifact location)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri[len("sqlite:///") :].split("?", 1)[0])
    return (database.expanduser().resolve().parent / "mlartifacts").as_uri()
