"""Storage options: merge explicit options with the environment into fsspec keyword arguments.

For ``s3`` the endpoint, region and credentials come from the options first, then from the standard
AWS variables (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``), and finally
from botocore's own default chain (instance roles, config files). Retries inside s3fs and botocore
are switched off: :mod:`storage.retry` is the one retry layer, so attempts never multiply.

Unknown option names are refused with the closest known name, because s3fs silently ignores them
(a typo such as ``endpoint`` would otherwise send traffic to AWS instead of the intended endpoint).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storage.errors import StorageConfigError
from storage.redact import REDACTED, is_secret_name
from storage.url import StorageURL

__all__ = ["S3_OPTION_NAMES", "ResolvedOptions", "resolve_options"]

_ALIASES = {
    "aws_access_key_id": "key",
    "access_key_id": "key",
    "aws_secret_access_key": "secret",
    "secret_access_key": "secret",
    "aws_session_token": "token",
    "session_token": "token",
    "region_name": "region",
}

#: options understood for s3:// (aliases above map onto these).
S3_OPTION_NAMES = frozenset(
    {
        "endpoint_url",
        "region",
        "key",
        "secret",
        "token",
        "profile",
        "anon",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "addressing_style",
        "verify",
        "use_ssl",
        "requester_pays",
        "default_block_size",
        "s3_additional_kwargs",
    }
)
_LOCAL_OPTION_NAMES = frozenset()

DEFAULT_REGION = "us-east-1"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ResolvedOptions:
    """fsspec keyword arguments plus a secret-free description of where each setting came from."""

    protocol: str
    fs_kwargs: dict[str, Any] = field(repr=False)
    describe: dict[str, Any] = field(default_factory=dict)


def resolve_options(
    url: StorageURL, options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> ResolvedOptions:
    """Turn ``options`` (plus ``env``, default ``os.environ``) into fsspec arguments for ``url``."""
    env = os.environ if env is None else env
    opts = _canonical(dict(options or {}))
    _refuse_placeholders(opts)
    if url.scheme == "s3":
        return _resolve_s3(opts, env)
    _check_names(opts, _LOCAL_OPTION_NAMES, url.scheme)
    return ResolvedOptions(protocol=url.scheme, fs_kwargs={}, describe={})


def _refuse_placeholders(opts: Mapping[str, Any]) -> None:
    """A secret option holding ``***`` came from a redacted file or record: say so, rather than let
    the store answer "invalid credentials" later."""
    placeholders = sorted(name for name, value in opts.items() if value == REDACTED and is_secret_name(name))
    if placeholders:
        raise StorageConfigError(
            f"storage option(s) {', '.join(placeholders)} hold {REDACTED!r}, the placeholder a redacted config or "
            "record carries instead of the secret; give the real value through the environment "
            "(AWS_SECRET_ACCESS_KEY...) or, for a job config, $AREAL_CONFIG_SECRETS"
        )


def _canonical(opts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in opts.items():
        target = _ALIASES.get(name, name)
        if target in out and out[target] != value:
            raise StorageConfigError(f"storage option {name!r} conflicts with {target!r}; give only one of them")
        out[target] = value
    return out


def _check_names(opts: Mapping[str, Any], allowed: frozenset[str], scheme: str) -> None:
    for name in opts:
        if name not in allowed:
            close = difflib.get_close_matches(name, sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(allowed)) or "none"
            raise StorageConfigError(f"unknown storage option {name!r} for {scheme}:// URLs{hint} (known: {known})")


def _first(opts: Mapping[str, Any], env: Mapping[str, str], name: str, env_names: tuple[str, ...]) -> tuple[Any, str]:
    if opts.get(name) not in (None, ""):
        return opts[name], "options"
    for env_name in env_names:
        if env.get(env_name):
            return env[env_name], f"env {env_name}"
    return None, "default"


def _resolve_s3(opts: dict[str, Any], env: Mapping[str, str]) -> ResolvedOptions:
    _check_names(opts, S3_OPTION_NAMES, "s3")
    endpoint, endpoint_src = _first(opts, env, "endpoint_url", ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    region, region_src = _first(opts, env, "region", ("AWS_REGION", "AWS_DEFAULT_REGION"))
    key, key_src = _first(opts, env, "key", ("AWS_ACCESS_KEY_ID",))
    secret, _ = _first(opts, env, "secret", ("AWS_SECRET_ACCESS_KEY",))
    token, _ = _first(opts, env, "token", ("AWS_SESSION_TOKEN",))
    profile, profile_src = _first(opts, env, "profile", ("AWS_PROFILE",))
    anon = bool(opts.get("anon", False))
    if (key is None) != (secret is None) and not anon:
        missing = "secret (AWS_SECRET_ACCESS_KEY)" if secret is None else "key (AWS_ACCESS_KEY_ID)"
        raise StorageConfigError(f"S3 credentials are incomplete: an access key is set but its {missing} is not")
    if endpoint is not None and not str(endpoint).startswith(("http://", "https://")):
        raise StorageConfigError(f"endpoint_url={endpoint!r} must start with http:// or https://")

    config_kwargs: dict[str, Any] = {
        "connect_timeout": float(opts.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)),
        "read_timeout": float(opts.get("read_timeout", DEFAULT_READ_TIMEOUT_S)),
        "retries": {"total_max_attempts": 1, "mode": "standard"},
    }
    if "max_pool_connections" in opts:
        config_kwargs["max_pool_connections"] = int(opts["max_pool_connections"])
    if "addressing_style" in opts:
        config_kwargs["s3"] = {"addressing_style": opts["addressing_style"]}
    client_kwargs: dict[str, Any] = {"region_name": region or DEFAULT_REGION}
    for name in ("verify", "use_ssl"):
        if name in opts:
            client_kwargs[name] = opts[name]

    fs_kwargs: dict[str, Any] = {
        "anon": anon,
        "client_kwargs": client_kwargs,
        "config_kwargs": config_kwargs,
        "skip_instance_cache": True,
        # other processes write the same prefixes (checkpoints, probes): never serve a stale listing.
        "use_listings_cache": False,
    }
    if endpoint is not None:
        fs_kwargs["endpoint_url"] = str(endpoint)
    if key is not None and not anon:
        fs_kwargs.update(key=str(key), secret=str(secret))
        if token is not None:
            fs_kwargs["token"] = str(token)
    elif profile is not None and not anon:
        fs_kwargs["profile"] = str(profile)
    for name in ("requester_pays", "default_block_size", "s3_additional_kwargs"):
        if name in opts:
            fs_kwargs[name] = opts[name]

    if anon:
        credential_source = "anonymous"
    elif key is not None:
        credential_source = f"access key {_mask(str(key))} from {key_src}"
    elif profile is not None:
        credential_source = f"profile {profile!r} from {profile_src}"
    else:
        credential_source = "botocore default chain"
    describe = {
        "endpoint_url": endpoint or "AWS default",
        "endpoint_source": endpoint_src,
        "region": region or DEFAULT_REGION,
        "region_source": region_src,
        "credentials_source": credential_source,
    }
    return ResolvedOptions(protocol="s3", fs_kwargs=fs_kwargs, describe=describe)


def _mask(key: str) -> str:
    return key[:4] + "..." if len(key) > 8 else "***"
