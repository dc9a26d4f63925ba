"""A small client of the Ray dashboard's REST API (Jobs and State API), with no ``ray`` import.

Airflow workers, triggerers and a login node talk to a Ray cluster only through this: every call
has a timeout, never goes through an HTTP proxy from the environment, and sends
``Authorization: Bearer <token>`` when a token is configured (a cluster started with
``RAY_AUTH_MODE=token``). Every failure is a :class:`~areal_tasks.errors.SchedulerError` that names
the URL and says what to check.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from typing import Any

from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_DASHBOARD_URL", "RayDashboard", "dashboard_url"]

DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8265"
_BODY_CHARS = 500


def dashboard_url(configured: str | None = None) -> str:
    """``configured``, else ``$RAY_API_SERVER_ADDRESS``, else :data:`DEFAULT_DASHBOARD_URL` (no trailing /)."""
    url = configured or os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_DASHBOARD_URL
    return url.rstrip("/")


class RayDashboard:
    """GET/POST JSON against one dashboard URL (``http://head:8265``)."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = dashboard_url(url)
        if not self.url.startswith(("http://", "https://")):
            raise SchedulerError(f"Ray dashboard URL {self.url!r} must start with http:// or https://")
        self.token = token or None
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(self, method: str, path: str, body: Any = None, *, missing_ok: bool = False) -> Any:
        """The decoded JSON answer of ``method path``; None for a 404 when ``missing_ok``."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = self.url + path
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", errors="replace")[:_BODY_CHARS]
            if exc.code == 404 and missing_ok:
                return None
            hint = (
                "the cluster wants a token: set the connection's password (RAY_AUTH_MODE=token)"
                if exc.code in (401, 403)
                else "see the answer above"
            )
            raise SchedulerError(
                f"Ray dashboard {method} {url} answered HTTP {exc.code}: {text.strip()}; {hint}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SchedulerError(
                f"Ray dashboard {url} is unreachable ({reason}) within {self.timeout_s:g}s; check that the head runs "
                "with the dashboard on (ray start --head --include-dashboard=true --dashboard-host=...), and the "
                "URL (cluster.ray.dashboard_url, the areal_ray connection or $RAY_API_SERVER_ADDRESS)"
            ) from exc
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SchedulerError(
                f"Ray dashboard {method} {url} did not answer JSON: {raw[:_BODY_CHARS]!r}; is this a Ray dashboard?"
            ) from exc

    def get(self, path: str, *, missing_ok: bool = False) -> Any:
        return self.request("GET", path, missing_ok=missing_ok)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, {} if body is None else body)
