"""The native side of the binding: the cffi declarations (``ffi``, ``decl/``), finding and loading the patched
libllama with its ABI checked (``loader``), llama.cpp's log (``log``), one way to turn a failed call into an
error (``check``), the lifetime of native objects (``handle``), the ELF check of a library (``elf``), the
environment a context reads (``env``) and what the binding learns of the MoE cache's state (``cache_status``).
Nothing here imports the tools: routing, benchmarks, the server and the command line sit above it."""
