"""Model conversion: GGUF checkpoints and tokenizers to Hugging Face folders."""
