"""The file formats llama_moe reads and writes, each validated with errors that name the place: STRP expert
profiles (``profile``), routing traces (``trace``), the MoE cache's audit records (``audit``), all written whole
or not at all (``atomic``). docs/formats.md describes them byte by byte and field by field. This package imports
only ``llama_moe.errors``."""
