"""The tiny-model kit: small random-weight HF models and a locally trained tokenizer for tests and the demo."""
