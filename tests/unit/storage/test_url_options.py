"""Storage URLs (paths, file://, s3://, memory://) and option resolution from options and the environment."""

from __future__ import annotations

import os

import pytest

from storage import StorageConfigError, parse_url
from storage.options import resolve_options
from storage.url import StorageURL, normalize_key


@pytest.mark.parametrize(
    ("text", "scheme", "path"),
    [
        ("/data/run", "file", "/data/run"),
        ("file:///data/run/", "file", "/data/run"),
        ("file://localhost/data//run", "file", "/data/run"),
        ("s3://my-bucket", "s3", "my-bucket"),
        ("s3://my-bucket/a/b/", "s3", "my-bucket/a/b"),
        ("s3a://my.bucket/a//b", "s3", "my.bucket/a/b"),
        ("memory://unit/x", "memory", "/unit/x"),
    ],
)
def test_parse_url(text: str, scheme: str, path: str) -> None:
    url = parse_url(text)
    assert (url.scheme, url.path) == (scheme, path)
    assert parse_url(str(url)) == url  # the canonical form parses back to itself


def test_relative_path_becomes_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_url("runs/x") == StorageURL("file", os.path.join(os.path.abspath("."), "runs", "x"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("gs://bucket/x", "unsupported scheme 'gs'"),
        ("file://otherhost/x", "names host 'otherhost'"),
        ("s3://", "bucket name '' is invalid"),
        ("s3://Upper_Case/x", "bucket name 'Upper_Case' is invalid"),
        ("s3://bucket/../x", "may not climb"),
    ],
)
def test_parse_url_rejects(text: str, message: str) -> None:
    with pytest.raises(StorageConfigError, match=message):
        parse_url(text)


def test_s3_parts_and_join() -> None:
    url = parse_url("s3://bkt/pre/fix")
    assert (url.bucket, url.key_prefix) == ("bkt", "pre/fix")
    assert str(url.join("a/./b")) == "s3://bkt/pre/fix/a/b"
    assert parse_url("s3://bkt").key_prefix == ""
    with pytest.raises(StorageConfigError, match="climbs above"):
        url.join("../other")
    with pytest.raises(StorageConfigError, match="no bucket"):
        _ = parse_url("/x").bucket


@pytest.mark.parametrize(("key", "normal"), [("", ""), (".", ""), ("a//b/./c/", "a/b/c"), ("a/../b", "b")])
def test_normalize_key(key: str, normal: str) -> None:
    assert normalize_key(key) == normal


def test_s3_options_from_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    }
    resolved = resolve_options(parse_url("s3://bkt/p"), {}, env)
    kw = resolved.fs_kwargs
    assert kw["endpoint_url"] == "http://127.0.0.1:9000"
    assert (kw["key"], kw["secret"]) == ("AKIAEXAMPLEKEY", "s3cr3t")
    assert kw["client_kwargs"]["region_name"] == "eu-west-1"
    assert kw["config_kwargs"]["retries"] == {"total_max_attempts": 1, "mode": "standard"}
    assert resolved.describe["endpoint_source"] == "env AWS_ENDPOINT_URL_S3"
    assert "s3cr3t" not in repr(resolved) and "s3cr3t" not in str(resolved.describe)
    assert "AKIAEXAMPLEKEY" not in str(resolved.describe)


def test_s3_options_override_environment_and_accept_aliases() -> None:
    env = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "envsecret"}
    options = {
        "endpoint_url": "http://opt:2",
        "aws_access_key_id": "OPTKEY",
        "aws_secret_access_key": "optsecret",
        "region_name": "us-west-2",
    }
    kw = resolve_options(parse_url("s3://bkt"), options, env).fs_kwargs
    assert (kw["endpoint_url"], kw["key"], kw["secret"]) == ("http://opt:2", "OPTKEY", "optsecret")
    assert kw["client_kwargs"]["region_name"] == "us-west-2"


def test_s3_default_region_and_chain() -> None:
    resolved = resolve_options(parse_url("s3://bkt"), {}, {})
    assert resolved.fs_kwargs["client_kwargs"]["region_name"] == "us-east-1"
    assert "key" not in resolved.fs_kwargs
    assert resolved.describe["credentials_source"] == "botocore default chain"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"endpoint": "http://x"}, "unknown storage option 'endpoint'.*did you mean 'endpoint_url'"),
        ({"key": "K"}, "incomplete"),
        ({"endpoint_url": "127.0.0.1:9000"}, "must start with http"),
        ({"key": "A", "aws_access_key_id": "B", "secret": "s"}, "conflicts"),
    ],
)
def test_s3_option_errors(options: dict, message: str) -> None:
    with pytest.raises(StorageConfigError, match=message):
        resolve_options(parse_url("s3://bkt"), options, {})


def test_local_storage_refuses_options() -> None:
    with pytest.raises(StorageConfigError, match="unknown storage option 'endpoint_url' for file"):
        resolve_options(parse_url("/x"), {"endpoint_url": "http://x"}, {})
