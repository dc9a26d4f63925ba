"""``areal model detect|tiny`` through the real command line (subprocesses), and the torch-free path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _areal(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a hub id must fail fast here, not retry a dead network
    return subprocess.run(
        [sys.executable, "-m", "areal_tasks.cli", "model", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_detect_prints_info_and_recommendation(tiny_dirs: dict[str, Path]) -> None:
    out = _areal("detect", str(tiny_dirs["qwen3_moe"]), "--gpus", "8", "--gpu-memory-gb", "40")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["family"], data["architecture"], data["is_moe"], data["vocab_size"]) == (
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        True,
        1024,
    )
    assert data["num_parameters"] > data["num_active_parameters"] > 0
    assert data["recommended"]["allocation"] == "sglang:d4+archon:d4e4"  # was megatron (not built)


def test_detect_without_gpus_has_no_recommendation(tiny_dirs: dict[str, Path]) -> None:
    out = _areal("detect", str(tiny_dirs["llama"]))
    assert out.returncode == 0, out.stderr
    assert "recommended" not in json.loads(out.stdout)


def test_tiny_writes_model_and_prints_detection(tmp_path: Path) -> None:
    out = _areal("tiny", "--family", "qwen2", "--out", str(tmp_path / "m"), "--seed", "0")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["path"] == str(tmp_path / "m") and data["model"]["family"] == "qwen2"
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_tiny_set_overrides_change_the_shape(tmp_path: Path) -> None:
    out = _areal(
        "tiny",
        "--family",
        "qwen2",
        "--out",
        str(tmp_path / "m"),
        "--set",
        "hidden_size=32",
        "--set",
        "intermediate_size=48",
        "--set",
        "tie_word_embeddings=true",
    )
    assert out.returncode == 0, out.stderr
    model = json.loads(out.stdout)["model"]
    assert (model["hidden_size"], model["intermediate_size"], model["head_dim"]) == (32, 48, 8)
    assert model["tie_word_embeddings"] is True


def test_tiny_set_errors_exit_2(tmp_path: Path) -> None:
    unknown = _areal("tiny", "--family", "qwen2", "--out", str(tmp_path / "a"), "--set", "hiden_size=32")
    assert unknown.returncode == 2 and "unknown qwen2 config key(s) hiden_size" in unknown.stderr
    assert "Traceback" not in unknown.stderr and not (tmp_path / "a").exists()
    malformed = _areal("tiny", "--family", "qwen2", "--out", str(tmp_path / "b"), "--set", "hidden_size")
    assert malformed.returncode == 2 and "KEY=VALUE" in malformed.stderr


def test_parse_overrides_types() -> None:
    from areal_tasks.cli.model_cmd import parse_overrides

    parsed = parse_overrides(["a=3", "b=1e-5", "c=False", "d=silu", "e=x=y"])
    assert parsed == {"a": 3, "b": 1e-5, "c": False, "d": "silu", "e": "x=y"}
    assert type(parsed["a"]) is int and type(parsed["b"]) is float


def test_user_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    missing = _areal("detect", str(tmp_path / "nope" / "model"))
    assert missing.returncode == 2 and "no such model directory" in missing.stderr
    assert "Traceback" not in missing.stderr
    hub = _areal("detect", "some-org/some-model")
    assert hub.returncode == 2 and "HF_ENDPOINT" in hub.stderr
    family = _areal("tiny", "--family", "gpt9", "--out", str(tmp_path / "x"))
    assert family.returncode == 2 and "gpt9" in family.stderr
    gpus = _areal("detect", "tiny:llama", "--gpus", "-2")
    assert gpus.returncode == 2 and "n_gpus" in gpus.stderr


def test_detection_and_layout_stay_torch_free(tiny_dirs: dict[str, Path]) -> None:
    code = (
        "import sys\n"
        "from areal_tasks.models import detect_model, recommend_layout\n"
        f"info = detect_model({str(tiny_dirs['qwen2'])!r})\n"
        "recommend_layout(info, 8)\n"
        "print(','.join(m for m in ('torch', 'transformers', 'peft', 'tokenizers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
