"""Test helpers that other projects' tests and benchmarks reuse: a real S3 server (SeaweedFS) and a
plain-subprocess probe runner for multi-node storage checks on one machine."""
