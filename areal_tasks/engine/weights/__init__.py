"""Weight senders from a train engine to the inference servers: sharded safetensors on disk
(:mod:`.disk`) and a bucketed broadcast over a collective group (:mod:`.collective`)."""
