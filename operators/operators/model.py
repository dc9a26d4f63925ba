"""``DetectModelOperator``: the model's architecture and a recommended parallel layout, to XCom.

Only the model's ``config.json`` is read (a hub id fetches that file alone), so this takes
milliseconds even for a 70B model; ``tiny:<family>`` builds the tiny test model first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.exceptions import ArealAirflowError

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["DetectModelOperator"]


class DetectModelOperator(BaseOperator):
    """Describe ``model`` (local dir, hub id or ``tiny:<family>``) and recommend a layout for ``n_gpus``.

    XCom: the model facts (``family``, ``architecture``, ``num_parameters``, ...) plus
    ``params`` (= ``num_parameters``), ``recommended_layout`` (the recommendation as a dict) and
    ``allocation`` (its allocation spec, e.g. ``sglang:d2+fsdp:d6`` or a CPU layout for ``n_gpus<=1``).
    """

    template_fields = ("model", "n_gpus", "gpu_memory_gb")
    ui_color = "#f6e7c9"

    def __init__(
        self,
        *,
        model: str,
        n_gpus: int | str = 0,
        gpu_memory_gb: float | str = 80.0,
        train_dtype: str = "bfloat16",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.n_gpus = n_gpus
        self.gpu_memory_gb = gpu_memory_gb
        self.train_dtype = train_dtype

    def execute(self, context: Context) -> dict[str, Any]:
        from areal_tasks.errors import ModelError
        from areal_tasks.models import detect_model, recommend_layout

        try:
            info = detect_model(str(self.model))
            layout = recommend_layout(info, int(self.n_gpus), float(self.gpu_memory_gb), self.train_dtype)
        except ModelError as exc:
            raise ArealAirflowError(f"cannot detect model {self.model!r}: {exc}") from exc
        except ValueError as exc:  # n_gpus / gpu_memory_gb rendered from a template that is not a number
            raise ArealAirflowError(f"n_gpus={self.n_gpus!r} / gpu_memory_gb={self.gpu_memory_gb!r}: {exc}") from exc
        recommended = layout.to_dict()
        self.log.info(
            "%s: %s, %.3gM parameters; recommended allocation %s (fits: %s)",
            self.model,
            info.architecture,
            info.num_parameters / 1e6,
            layout.allocation,
            layout.fits,
        )
        for reason in layout.reasons:
            self.log.info("layout: %s", reason)
        return {
            **info.to_dict(),
            "params": info.num_parameters,
            "recommended_layout": recommended,
            "allocation": layout.allocation,
        }
