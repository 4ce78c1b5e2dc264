"""Measurements: the main job's report (``stats``), throughput of every way to run a model whose experts live in
RAM (``bench``, with its plot), the adaptive cache against profiles of the right and of other text
(``bench-adaptive``), and the machine's bandwidths the bounds come from. Importing it loads nothing native."""
