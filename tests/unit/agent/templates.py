"""Test tokenizers for the agent package: the tiny kit's (ChatML) and a Qwen2.5-style Hermes one.

``QWEN25_STYLE_TEMPLATE`` is written for these tests to reproduce the Qwen2.5 tool format (not
copied from Qwen's file): tools as JSON lines in the system turn (a default system prompt when there
is none), assistant tool calls as ``<tool_call>\\n{"name": .., "arguments": <tojson>}\\n</tool_call>``
after the content, and tool results as ``<tool_response>`` blocks inside one user turn per run of
consecutive tool messages. It is used with the tiny kit's tokenizer.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

QWEN25_STYLE_TEMPLATE = r"""
{%- set default_system = 'You are a helpful assistant.' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- else -%}{{- default_system -}}{%- endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
{{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": ' -}}
{{- '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message.content -%}{{- message.content -}}{%- endif -%}
{%- for tool_call in message.tool_calls or [] -%}
{%- set fn = tool_call.function if tool_call.function is defined else tool_call -%}
{%- if message.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}{{- fn.arguments | tojson -}}{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    """The tiny kit's tokenizer with its ChatML template (cached: do not modify)."""
    from areal_tasks.models.tokenizer import load_tokenizer

    return load_tokenizer("tiny")


@functools.lru_cache(maxsize=1)
def qwen_style_tokenizer() -> Any:
    """The tiny kit's tokenizer with :data:`QWEN25_STYLE_TEMPLATE` (cached: do not modify)."""
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = QWEN25_STYLE_TEMPLATE
    return tok


def tokenizer_named(name: str) -> Any:
    """``"chatml"`` (the kit's template) or ``"qwen25"`` (the Qwen2.5-style Hermes one)."""
    return tiny_tokenizer() if name == "chatml" else qwen_style_tokenizer()
