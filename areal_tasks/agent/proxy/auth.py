"""Who is asking: the admin (the trainer, the agent runner) or one session, from the bearer token.

* Admin routes (``/rl/start_session``, ``/rl/sessions/{id}``, ``/rl/groups/next``) need
  ``Authorization: Bearer <admin key>``. Without an admin key they are refused, unless the proxy
  was started with ``allow_unauthenticated_admin`` (``areal proxy --allow-unauthenticated-admin``,
  loopback only). In-process callers use :class:`~areal_tasks.agent.proxy.store.SessionStore`
  directly and need no key.
* ``/v1`` routes need a session's key: the request then belongs to that session
  (:meth:`SessionStore.authenticate`, which says why a key is refused: unknown, ended, expired).
* ``/rl/set_reward`` and ``/rl/end_session`` take a session's key, or the admin key with the
  ``session_id`` in the body.

Keys are compared in constant time and never logged; a refusal is a 401 in OpenAI's error shape.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

from areal_tasks.agent.proxy.errors import ProxyRefusal

logger = logging.getLogger(__name__)

__all__ = ["AdminAuth", "bearer"]


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class AdminAuth:
    """The admin key of one proxy (None: admin routes closed unless ``open_admin``)."""

    key: str | None = field(repr=False)
    open_admin: bool = False

    def is_admin(self, token: str | None) -> bool:
        """Whether ``token`` is the admin key (every token is, with open admin routes and no key)."""
        if self.key is None:
            return self.open_admin
        return token is not None and secrets.compare_digest(token.encode(), self.key.encode())

    def require(self, token: str | None, what: str) -> None:
        """401 ProxyRefusal unless ``token`` is the admin key."""
        if self.is_admin(token):
            return
        logger.warning("refused %s: missing or wrong admin key", what)
        detail = "this proxy has no admin key: admin routes are closed" if self.key is None else "send the admin key"
        raise ProxyRefusal(401, f"{what} needs the admin key ({detail})", code="invalid_api_key")
