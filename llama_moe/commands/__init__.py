"""The subcommands of ``python -m llama_moe``."""
