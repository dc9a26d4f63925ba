"""Weight transports: how a train engine's weights reach the inference servers, one class per mode.

Owned by neither the engine nor the server: each mode's class holds its sending side (trainer
ranks), its controller side (the update the servers are sent, the bucket plan) and its receiving
side (what a server does with one load). :mod:`.base` is the contract, :mod:`.registry` maps
``rollout.weight_update`` to a class; :mod:`.disk`, :mod:`.collective` and :mod:`.shared` are the
modes, :mod:`.buckets`, :mod:`.group` and :mod:`.shared_buffer` what they share. The trainer, the
embedded server and the vLLM plugin import them from here; nothing here imports an engine.
"""
