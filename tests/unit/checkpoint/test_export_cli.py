"""HF export and the ``areal checkpoint`` CLI in one process: a plain HF engine and a peft LoRA engine
are saved, listed, inspected and exported; transformers loads the export with the model's exact
weights (LoRA: equal to peft's own ``merge_and_unload``) and logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.cli import main
from areal_tasks.engine.module_state import ModuleCheckpointing


class HFEngine(ModuleCheckpointing):
    """A single-process engine over a transformers model (optionally LoRA-wrapped with peft)."""

    role = "actor"

    def __init__(self, model_path: Path, lora: bool = False) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        self.model_path = str(model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        self.model = model
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        self.lr_scheduler = None
        self._version = 0

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def step(self) -> None:
        ids = torch.randint(0, 1024, (2, 12))
        self.model(input_ids=ids, labels=ids).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


@pytest.fixture(params=[False, True], ids=["full", "lora"])
def saved(request, tiny_qwen2, file_url, make_manager):
    engine = HFEngine(tiny_qwen2, lora=request.param)
    manager = make_manager(file_url)
    for step in (1, 2):
        engine.step()
        manager.save(step, {"actor": engine}, TrainerState(step=step), {"loss": 1.0 / step}).wait()
    return engine, manager


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_inspect_export(saved, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine, manager = saved
    code, out, _ = _cli(capsys, "checkpoint", "list", manager.url, "--json")
    assert code == 0
    listing = json.loads(out)
    assert listing["latest"] == 2 and [c["status"] for c in listing["checkpoints"]] == ["complete", "complete"]
    code, out, _ = _cli(capsys, "checkpoint", "list", manager.url)
    assert code == 0 and "complete" in out and "loss=0.5" in out
    code, out, _ = _cli(capsys, "checkpoint", "inspect", f"{manager.url}/step_1")
    assert code == 0 and json.loads(out)["step"] == 1 and json.loads(out)["metrics"] == {"loss": 1.0}

    code, out, _ = _cli(capsys, "checkpoint", "export", manager.url, "--hf", str(tmp_path / "hf"))
    assert code == 0 and json.loads(out)["step"] == 2
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    reference = engine.model.merge_and_unload() if hasattr(engine.model, "merge_and_unload") else engine.model
    expected = reference.state_dict()
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)
    ids = torch.randint(0, 1024, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf")) is not None


def test_cli_errors_are_one_line(saved, tmp_path, capsys):
    _, manager = saved
    code, _, err = _cli(capsys, "checkpoint", "inspect", manager.url, "--step", "7")
    assert code == 2 and "not a complete checkpoint" in err and "Traceback" not in err
    code, _, err = _cli(capsys, "checkpoint", "export", manager.url, "--hf", str(tmp_path / "x"), "--engine", "critic")
    assert code == 2 and "no engine 'critic'" in err
    code, _, err = _cli(capsys, "checkpoint", "list", f"file://{tmp_path}/nothing-here")
    assert code == 2 and "no checkpoints folder" in err, "a mistyped URL is an error, not an empty listing"
