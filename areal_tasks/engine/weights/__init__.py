"""Weight senders from a train engine to the inference servers: a bucketed broadcast over a
collective group (:mod:`.collective`) and shared-memory buffers on the trainer's host (:mod:`.shared`)."""
