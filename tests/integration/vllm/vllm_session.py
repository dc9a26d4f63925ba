"""A test's handle on the shared vLLM server: a client at the right version, and disk updates.

Tests share one server, so each test starts from known weights: the ``vllm`` fixture (conftest)
loads the base model (seed 0) before and after every test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_test_server import SERVED_NAME, VLLMServer

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
from areal_tasks.models.safetensors_dir import read_safetensors_dir, write_safetensors_shards
from storage.atomic import atomic_directory

#: shards of at most this many bytes, so a checkpoint of the tiny model spans several files + index.
SHARD_BYTES = 128 * 1024


@dataclass
class VLLMSession:
    """The server, the policy version its weights carry, and a scratch directory."""

    server: VLLMServer
    version: int
    workdir: Path

    def client(self) -> RemoteInferenceEngine:
        """A client of the server at the current version (use it as ``async with``)."""
        config = ClientConfig(
            request_timeout_s=120.0, max_retries=2, retry_backoff_s=0.05, api_key=self.server.api_key or None
        )
        return RemoteInferenceEngine(
            [self.server.address], make_adapter("vllm", model=SERVED_NAME), config, version=self.version
        )

    def publish(self, model_dir: Path) -> tuple[Path, int]:
        """Write ``model_dir``'s weights as the trainer does (sharded, atomic); return (dir, next version)."""
        version = self.version + 1
        target = self.workdir / f"weights-v{version}"
        with atomic_directory(target, on_exists="replace_owned") as staging:
            write_safetensors_shards(read_safetensors_dir(model_dir), staging, max_shard_bytes=SHARD_BYTES)
        return target, version

    async def load(self, model_dir: Path) -> int:
        """Pause, load ``model_dir``'s weights from disk as the next version, resume; return it."""
        path, version = self.publish(model_dir)
        async with self.client() as client:
            await client.pause()
            await client.update_weights(WeightUpdateMeta.disk(str(path), version))
            await client.resume()
        self.version = version
        return version
