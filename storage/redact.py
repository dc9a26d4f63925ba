"""One redaction for everything people read: names, URLs, mappings, command lines, free text, logs.

Every place that shows a value to a person (a log line, an error message, a job record, the
resolved config, MLflow params, checkpoint metadata) runs it through this module, so the rules live
in one file. It sits in ``storage`` (the bottom of the import graph: ``storage`` may not import
``areal_tasks``, and both need it) and imports only the standard library.

What counts as a secret:

* **names** (:func:`is_secret_name`): the *last word* of a key or flag decides, so that
  ``--aws-secret-access-key``, ``storage.options.secret``, ``password``, ``hf_token`` and
  ``api_key`` are secret while ``api_key_env`` (names a variable), ``max_new_tokens``,
  ``stop_token_ids``, ``max_prefill_tokens`` and ``pad_token`` (a tokenizer's) stay readable.
  "``token`` anywhere", the obvious rule, would hide the sampling config;
* **URLs** (:func:`redact_url`): the password of the userinfo (``https://user:***@host``,
  ``s3://KEY:***@bucket``) and signed or keyed query parameters (``X-Amz-Signature``,
  ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``sig``, ``token``, ``access_token``, ``key``...);
* **values registered at run time** (:func:`register_secret`), as Airflow's ``mask_secret`` does:
  once a process knows a string is a secret (it came through the secrets channel, or under a
  secret name), every later text it redacts has it replaced, wherever it appears.

The replacement is always :data:`REDACTED` (``***``), which is also the placeholder a redacted
config file holds; redacting a redacted value changes nothing (the functions are idempotent).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "clear_registered_secrets",
    "hidden_parts",
    "install_log_redaction",
    "is_secret_name",
    "redact_argv",
    "redact_mapping",
    "redact_text",
    "redact_url",
    "redact_value",
    "register_secret",
]

logger = logging.getLogger(__name__)

#: what a secret is replaced with (and the placeholder a redacted file holds).
REDACTED = "***"
#: registered values shorter than this are not masked in free text (they would hide common words
#: and numbers everywhere); Airflow's ``min_length_masked_secret`` default.
MIN_REGISTERED_LENGTH = 5

#: a name whose last word is one of these is a secret ...
_SECRET_WORDS = frozenset(("secret", "password", "passwd", "passphrase", "token", "credential", "credentials")) | {
    *("apikey", "accesskey", "secretkey", "privatekey", "authorization")
}
#: ... or whose last two words are one of these.
_SECRET_PAIRS = frozenset(
    (word, "key") for word in ("api", "access", "secret", "private", "signing", "encryption", "auth", "master")
)
#: ``<word>_token`` names a tokenizer's special token or a count, not a credential.
_NOT_CREDENTIAL_TOKEN = frozenset(("pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end")) | {
    *("image", "video", "audio", "vision", "stop", "max", "min", "num", "per", "first", "last", "next"),
    *("prefix", "suffix"),
}
#: query parameters that carry a signature or a key, beyond the secret names above.
_SECRET_QUERY_PARAMS = frozenset(("sig", "signature", "key", "awsaccesskeyid")) | {
    *("x-amz-signature", "x-amz-credential", "x-goog-signature", "x-goog-credential")
}

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# scheme://[userinfo@]rest; the password may hold '/' and '+' (AWS secret keys do), so the userinfo
# runs to the last '@' before whitespace, not to the first '/'.
_URL = re.compile(r"(?<![\w+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_USERINFO = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/:@?#\s]*):(?P<password>[^@\s]*)@(?P<rest>.*)$"
)
# host:port/path@... has no userinfo: what looks like a password is a port
_PORT_AND_PATH = re.compile(r"^\d+(?:[/?#]|$)")
# key=value (also --flag=value) and 'key': 'value' / "key": "value" in free text
_KEY_VALUE = re.compile(r"(?<![\w.-])(?P<key>-{0,2}[A-Za-z_][\w.-]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",;&)}\]]+)")
_QUOTED_PAIR = re.compile(
    r"(?P<q>['\"])(?P<key>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*:\s*)(?P<vq>['\"])(?P<value>.*?)(?P=vq)"
)
# key: value inside a YAML flow mapping ({key: A, secret: B}), as overrides write them
_FLOW_MAPPING = re.compile(r"\{[^{}]*\}")
_FLOW_PAIR = re.compile(
    r"(?<![\w.-])(?P<key>[A-Za-z_][\w.-]*)(?P<sep>\s*:\s*)(?P<value>'[^']*'|\"[^\"]*\"|[^\s,{}\[\]'\"]+)"
)
_DOTTED_KEY = re.compile(r"^[A-Za-z_][\w.-]*$")

_lock = threading.Lock()
_registered: frozenset[str] = frozenset()
_registered_pattern: re.Pattern[str] | None = None


# ---------------------------------------------------------------------------------------- names


def _words(name: str) -> list[str]:
    last = name.strip().lstrip("-").rsplit(".", 1)[-1]
    return [w for w in _WORD_SPLIT.split(_CAMEL.sub(r"\1_\2", last).lower()) if w]


def is_secret_name(name: str) -> bool:
    """Whether the value of ``name`` (a config key, a dotted path, a ``--flag``, a variable) is secret.

    The last dotted part is split into words on ``_``, ``-`` and camelCase; its last word (or last
    two) decides (see the module docstring).
    """
    if not isinstance(name, str):
        return False
    words = _words(name)
    if not words:
        return False
    last = words[-1]
    if last == "token" and len(words) > 1 and words[-2] in _NOT_CREDENTIAL_TOKEN:
        return False
    if last in _SECRET_WORDS:
        return True
    return len(words) > 1 and (words[-2], last) in _SECRET_PAIRS


def _is_secret_query_param(name: str) -> bool:
    return name.lower() in _SECRET_QUERY_PARAMS or is_secret_name(name)


# ---------------------------------------------------------------------------------------- URLs


def _redact_params(text: str) -> str:
    parts = []
    for item in text.split("&"):
        key, eq, value = item.partition("=")
        parts.append(f"{key}={REDACTED}" if eq and value and _is_secret_query_param(key) else item)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with the userinfo password and signed or keyed query parameters replaced by ``***``.

    The user name stays (it says who, not how). Text that is not a URL comes back unchanged.
    """
    if not isinstance(url, str) or "://" not in url:
        return url
    match = _USERINFO.match(url)
    if match and match.group("password") and not _PORT_AND_PATH.match(match.group("password")):
        url = f"{match.group('scheme')}{match.group('user')}:{REDACTED}@{match.group('rest')}"
    head, hash_mark, fragment = url.partition("#")
    base, question, query = head.partition("?")
    if question:
        head = f"{base}?{_redact_params(query)}"
    if hash_mark and "=" in fragment:
        fragment = _redact_params(fragment)
    return head + hash_mark + fragment


# ---------------------------------------------------------------------------------------- free text


def _mask_key_value(match: re.Match[str]) -> str:
    value = match.group("value")
    if not is_secret_name(match.group("key")) or value.strip("'\"") in ("", REDACTED):
        return match.group(0)
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match.group('key')}={quote}{REDACTED}{quote}"


def _mask_quoted_pair(match: re.Match[str]) -> str:
    if not is_secret_name(match.group("key")) or not match.group("value"):
        return match.group(0)
    q, vq = match.group("q"), match.group("vq")
    return f"{q}{match.group('key')}{q}{match.group('sep')}{vq}{REDACTED}{vq}"


def _mask_flow_pair(match: re.Match[str]) -> str:
    value = match.group("value")
    if not is_secret_name(match.group("key")) or value.strip("'\"") in ("", REDACTED):
        return match.group(0)
    return f"{match.group('key')}{match.group('sep')}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with URL secrets, ``secret_name=value`` pairs, ``'secret_name': 'value'`` pairs,
    ``{secret_name: value}`` flow-mapping entries and every registered secret value replaced by
    ``***`` (for error messages and log lines)."""
    if not isinstance(text, str) or not text:
        return text
    pattern = _registered_pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    if "=" in text:
        text = _KEY_VALUE.sub(_mask_key_value, text)
    if ":" in text:
        text = _QUOTED_PAIR.sub(_mask_quoted_pair, text)
        if "{" in text:
            text = _FLOW_MAPPING.sub(lambda m: _FLOW_PAIR.sub(_mask_flow_pair, m.group(0)), text)
    return text


# ---------------------------------------------------------------------------------------- argv


def _is_flag(part: str) -> bool:
    return len(part) > 1 and part.startswith("-") and not part[1:2].isdigit() and part[1:2] != "."


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` safe to show: ``--secret-flag VALUE``, ``--secret-flag=VALUE``,
    ``a.b.secret=VALUE`` and ``SECRET_ENV=VALUE`` get ``***`` for the value, URL values lose their
    secrets, and registered values are masked wherever they appear."""
    out: list[str] = []
    mask_next = False
    for item in argv:
        part = str(item)
        if mask_next:
            mask_next = False
            if not part.startswith("--"):
                out.append(REDACTED)
                continue
        if _is_flag(part):
            flag, eq, value = part.partition("=")
            if is_secret_name(flag):
                if eq:
                    out.append(f"{flag}={REDACTED}")
                else:
                    out.append(part)
                    mask_next = True
                continue
            out.append(f"{flag}={redact_text(value)}" if eq else part)
            continue
        key, eq, value = part.partition("=")
        if eq and _DOTTED_KEY.match(key) and is_secret_name(key):
            out.append(f"{key}={REDACTED}" if value else part)
            continue
        out.append(f"{key}={redact_text(value)}" if eq and _DOTTED_KEY.match(key) else redact_text(part))
    return out


# ---------------------------------------------------------------------------------------- structures


def redact_value(value: Any, name: str | None = None) -> Any:
    """``value`` made safe to show, recursively: under a secret ``name`` a value becomes ``***``
    (booleans, ``None`` and empty values stay: they reveal nothing and keep their type); mappings
    are walked key by key; a list of strings is treated as a command line (:func:`redact_argv`);
    other lists item by item; strings through :func:`redact_text`."""
    if name is not None and is_secret_name(name) and not _reveals_nothing(value):
        return REDACTED
    if isinstance(value, Mapping):
        return {key: redact_value(item, str(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, str) for item in value):
            return redact_argv(value)
        return [redact_value(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _reveals_nothing(value: Any) -> bool:
    return value is None or isinstance(value, bool) or (isinstance(value, (str, list, tuple, dict)) and not value)


def redact_mapping(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A redacted copy of ``mapping`` (see :func:`redact_value`)."""
    return redact_value(dict(mapping))


# ---------------------------------------------------------------------------------------- registered values


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield str(value)


def hidden_parts(value: Any, name: str | None = None) -> list[str]:
    """The substrings of ``value`` that :func:`redact_value` hides: a URL's password and signature
    rather than the whole URL, a flag's value rather than the command line (what to register)."""
    return [part for part in _diff_parts(value, redact_value(value, name)) if part]


def _diff_parts(plain: Any, shown: Any) -> Iterable[str]:
    if type(plain) is type(shown) and plain == shown:
        return
    if isinstance(plain, Mapping) and isinstance(shown, Mapping):
        for key, item in plain.items():
            yield from _diff_parts(item, shown.get(key))
    elif isinstance(plain, (list, tuple)) and isinstance(shown, (list, tuple)) and len(plain) == len(shown):
        for item, shown_item in zip(plain, shown, strict=True):
            yield from _diff_parts(item, shown_item)
    elif isinstance(plain, str) and isinstance(shown, str):
        # the shown text is the original with some spans replaced by ***: the spans are what it hides
        pattern = "(.*?)".join(re.escape(piece) for piece in shown.split(REDACTED))
        match = re.fullmatch(pattern, plain, re.DOTALL)
        yield from (match.groups() if match else (plain,))
    else:
        yield from _strings(plain)


def register_secret(value: Any) -> None:
    """Mask ``value`` (a string, or every string in a mapping or list) in all later redacted text
    of this process. Values shorter than :data:`MIN_REGISTERED_LENGTH` and the placeholder itself
    are skipped."""
    global _registered, _registered_pattern
    new = {s for s in _strings(value) if len(s) >= MIN_REGISTERED_LENGTH and s != REDACTED}
    with _lock:
        if new <= _registered:
            return
        _registered = _registered | new
        # longest first, so a secret that contains another is replaced whole
        alternatives = sorted(_registered, key=len, reverse=True)
        _registered_pattern = re.compile("|".join(re.escape(s) for s in alternatives))
    logger.debug("registered %d secret value(s) for redaction (%d in all)", len(new), len(_registered))


def clear_registered_secrets() -> None:
    """Forget every registered value (tests)."""
    global _registered, _registered_pattern
    with _lock:
        _registered = frozenset()
        _registered_pattern = None


# ---------------------------------------------------------------------------------------- logging


class RedactingFilter(logging.Filter):
    """A handler filter that passes each record's message (and traceback text) through :func:`redact_text`.

    Attach it to handlers, not loggers: a logger's filters do not see records propagated from its
    children, a handler's see every record it writes.
    """

    _FLAG = "_areal_redacted"

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, self._FLAG, False):
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True  # a malformed record: the handler reports the formatting error itself
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        setattr(record, self._FLAG, True)
        return True


def install_log_redaction(target: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``target`` (default: the root logger)
    that has none yet. Call it after logging is configured."""
    for handler in (target or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
