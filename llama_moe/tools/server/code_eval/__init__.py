"""A smoke test of a served model's coding: Python tasks sent through the OpenAI chat endpoint, each answer
run against asserts in a child process."""
from .runner import CodeEvalResult, TaskResult, evaluate, extract_code, run_answer, serve_and_evaluate
from .tasks import SUITES, Task

__all__ = ["CodeEvalResult", "SUITES", "Task", "TaskResult", "evaluate", "extract_code", "run_answer", "serve_and_evaluate"]
