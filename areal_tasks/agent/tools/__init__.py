"""Tools that agents call: plain Python functions with their OpenAI tool schemas.

Each tool returns its result as the text of a ``role: tool`` message; a bad call (malformed
arguments, an expression it refuses) comes back as an error text the model can read, never as an
exception into the agent loop. Stdlib only, so a black-box agent's own venv can import them.
"""

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL, calculate, call_calculator

__all__ = ["CALCULATOR_TOOL", "calculate", "call_calculator"]
