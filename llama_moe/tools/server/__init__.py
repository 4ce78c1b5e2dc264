"""llama-server with the MoE cache: its process (``process``), the plan that fits the cache to a GPU (``plan``),
its ``/metrics`` (``metrics``, ``report``), the audit log's runs and invariants (``audit``), the live monitor
page (``monitor``), and the checks of a served installation (``check_api``, ``check_audit``, ``check_all``,
``code_eval``)."""
