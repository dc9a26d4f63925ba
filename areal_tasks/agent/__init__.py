"""RL for agents: an OpenAI-compatible client and proxy whose every completion becomes training data.

``ArealOpenAI`` is used by agent code exactly like ``openai.AsyncOpenAI``; it generates through the
job's inference engine and records each call's exact prompt and output tokens, log-probs and policy
versions in an interaction cache that links multi-turn calls into one trajectory. The proxy
(``areal_tasks.agent.proxy``, ``areal proxy``) serves the same over HTTP, per session, so an agent
nobody can modify is trained by pointing its ``base_url`` at it. See ``docs/agents.md``.
"""
