"""What went wrong with an HTTP request to a server, in a few words."""
from __future__ import annotations


def request_error(exc: BaseException) -> str:
    """What went wrong with an HTTP request, in a few words: the socket's own error ("Connection refused")
    when there is one, not the client library's chain of wrappers."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        todo += [getattr(e, "reason", None), e.__cause__, e.__context__, *(a for a in e.args if isinstance(a, BaseException))]
    return str(exc)
