"""The one redaction (``storage.redact``): which names are secret, URLs, command lines, mappings,
free text, registered values and the logging filter. Each secret below must vanish; each public
value must come through unchanged."""

from __future__ import annotations

import logging

import pytest

from storage.redact import (
    REDACTED,
    RedactingFilter,
    clear_registered_secrets,
    is_secret_name,
    redact_argv,
    redact_mapping,
    redact_text,
    redact_url,
    register_secret,
)


@pytest.fixture(autouse=True)
def _no_registered_secrets():
    clear_registered_secrets()
    yield
    clear_registered_secrets()


SECRET_NAMES = [
    "--aws-secret-access-key",
    "storage.options.secret",
    "password",
    "--password",
    "passwd",
    "hf_token",
    "--hf-token",
    "HF_TOKEN",
    "access_token",
    "api_key",
    "--api-key",
    "--admin-api-key",
    "apiKey",
    "secretAccessKey",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "client_secret",
    "private_key",
    "X-Amz-Security-Token",
    "X-Amz-Credential",
    "credentials",
]
PUBLIC_NAMES = [
    "api_key_env",
    "admin_api_key_env",
    "--api-key-env",
    "max_new_tokens",
    "stop_token_ids",
    "max_prefill_tokens",
    "pad_token",
    "eos_token",
    "tokenizer_path",
    "prompt_key",
    "answer_key",
    "key",
    "aws_access_key_id",
    "secret_env",
    "api_key_file",
    "temperature",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_names(name: str) -> None:
    assert not is_secret_name(name)


def test_no_field_of_the_job_config_is_taken_for_a_secret() -> None:
    """Redacting the resolved config must not hide a setting: no schema field name is secret."""
    import typing

    from areal_tasks.config import JobConfig
    from areal_tasks.config.schema_types import field_types, is_dataclass_type, is_tagged_union, strip_optional

    seen: set[type] = set()
    flagged: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        if cls in seen:
            return
        seen.add(cls)
        classes = [cls.variant_class(n) for n in cls.names()] if is_tagged_union(cls) else [cls]
        for klass in classes:
            for name, tp in field_types(klass).items():
                if is_secret_name(name):
                    flagged.append(f"{prefix}{name}")
                inner, _ = strip_optional(tp)
                for candidate in (inner, *typing.get_args(inner)):
                    if is_dataclass_type(candidate):
                        walk(candidate, f"{prefix}{name}.")

    walk(JobConfig, "")
    assert len(seen) >= 10  # the walk reached the sections
    assert not flagged


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:PASS3@mlflow.example/", "https://user:***@mlflow.example/"),
        ("s3://AKIA:S3CRET/with+slash@bucket/x", "s3://AKIA:***@bucket/x"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc"
            "&X-Amz-Security-Token=tok",
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&X-Amz-Signature=***"
            "&X-Amz-Security-Token=***",
        ),
        (
            "https://acct.blob.core.windows.net/c/b?sv=2020&sig=SIGNED",
            "https://acct.blob.core.windows.net/c/b?sv=2020&sig=***",
        ),
        ("https://api.example/v1?key=AIzaKEY&q=1", "https://api.example/v1?key=***&q=1"),
        ("https://h/cb#access_token=TOK&state=1", "https://h/cb#access_token=***&state=1"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://host:8080/pkg/@scope/x", "https://host:8080/pkg/@scope/x"),
        ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
        ("ssh://git@github.com/o/r", "ssh://git@github.com/o/r"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert redact_url(expected) == expected  # idempotent


def test_redact_argv_every_form() -> None:
    argv = [
        "areal",
        "--aws-secret-access-key",
        "S3CRET1",
        "storage.options.secret=S3CRET2",
        "tracking.mlflow_uri=https://user:PASS3@mlflow.example/",
        "storage.url=s3://AKIA:S3CRET4@bucket/x",
        "--api-key",
        "K5XXX",
        "--hf-token=T6XXX",
        "storage.options={key: AKIA, secret: S3CRET7}",
        "AWS_SECRET_ACCESS_KEY=S3CRET8",
        "--endpoint=https://u:S3CRET9@e",
        "--api-key-env",
        "MY_KEY_VAR",
        "rollout.sampling.max_new_tokens=64",
        "rollout.sampling.stop_token_ids=[1, 2]",
        "--token",
        "--verbose",
    ]
    shown = redact_argv(argv)
    text = " ".join(shown)
    for secret in ("S3CRET1", "S3CRET2", "PASS3", "S3CRET4", "K5XXX", "T6XXX", "S3CRET7", "S3CRET8", "S3CRET9"):
        assert secret not in text
    assert shown[1:3] == ["--aws-secret-access-key", REDACTED]
    assert "--api-key-env MY_KEY_VAR" in text
    assert "rollout.sampling.max_new_tokens=64" in shown
    assert "rollout.sampling.stop_token_ids=[1, 2]" in shown
    assert shown[-2:] == ["--token", "--verbose"]  # a flag after a secret flag is not its value
    assert "storage.options={key: AKIA, secret: ***}" in shown
    assert redact_argv(shown) == shown


def test_redact_mapping_nested() -> None:
    options = {
        "key": "AKIA",
        "secret": "S3CRET",
        "client_kwargs": {"aws_session_token": "TOK"},
        "endpoint_url": "https://u:PW@minio:9000",
        "anon": False,
        "token": None,
        "extra_args": ["--api-key", "K"],
        "stop_token_ids": [1, 2],
    }
    assert redact_mapping(options) == {
        "key": "AKIA",
        "secret": REDACTED,
        "client_kwargs": {"aws_session_token": REDACTED},
        "endpoint_url": "https://u:***@minio:9000",
        "anon": False,
        "token": None,
        "extra_args": ["--api-key", REDACTED],
        "stop_token_ids": [1, 2],
    }


def test_redact_text_urls_pairs_and_registered_values() -> None:
    register_secret("REGISTERED-VALUE")
    register_secret("abc")  # too short to mask in free text: it would hide ordinary words
    text = (
        "error: S3 URL 's3://AKIAXX:TOPSECRET@bucket/x': bad bucket; options {'secret': 'S3', 'key': 'AK'}; "
        "override 'storage.options.password=hunter22' failed; got REGISTERED-VALUE back; "
        'login(password="quoted pw33"); abc'
    )
    shown = redact_text(text)
    for secret in ("TOPSECRET", "'S3'", "hunter22", "REGISTERED-VALUE", "pw33"):
        assert secret not in shown
    assert "'key': 'AK'" in shown and shown.endswith("abc")
    assert redact_text(shown) == shown
    assert redact_text("storage.options.secret: expected str, got 5") == "storage.options.secret: expected str, got 5"


def test_logging_filter_masks_message_args_and_traceback() -> None:
    register_secret("S3CRET-IN-LOG")
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("test_redact.filter")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("connecting to %s with %s", "https://u:PW123@h/", "S3CRET-IN-LOG")
        try:
            raise RuntimeError("failed with password=hunter22")
        except RuntimeError:
            log.exception("boom")
    finally:
        log.removeHandler(handler)
    joined = "\n".join(records)
    assert "PW123" not in joined and "S3CRET-IN-LOG" not in joined and "hunter22" not in joined
    assert "https://u:***@h/" in joined


@pytest.mark.parametrize(
    "url", ["s3://AKIAXX:TOPSECRET@bucket/x", "s3://AKIA:with/slash+plus@bucket/x", "s3://bucket/x?X-Amz-Signature=SIG"]
)
def test_a_storage_url_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    from storage.errors import StorageConfigError
    from storage.url import parse_url

    with pytest.raises(StorageConfigError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert "TOPSECRET" not in message and "slash+plus" not in message and "SIG" not in message
    assert "AWS_ACCESS_KEY_ID" in message and "***" in message


def test_a_redacted_storage_option_is_refused_with_its_fix() -> None:
    from storage.errors import StorageConfigError
    from storage.options import resolve_options
    from storage.url import parse_url

    with pytest.raises(StorageConfigError, match="secret hold '\\*\\*\\*', the placeholder"):
        resolve_options(parse_url("s3://bucket/x"), {"key": "AKIA", "secret": REDACTED}, env={})


def test_hidden_parts_are_the_secret_spans_not_the_whole_value() -> None:
    from storage.redact import hidden_parts

    assert hidden_parts("https://user:PASS3@h/x?sig=SIG5&a=1") == ["PASS3", "SIG5"]
    assert hidden_parts(["--api-key", "K5XXX", "--port", "1"]) == ["K5XXX"]
    assert hidden_parts({"key": "AKIA", "secret": "S3CRET", "n": {"token": 12345}}) == ["S3CRET", "12345"]
    assert hidden_parts("plain") == []
