"""The exceptions a request can end in, shared by both servers and the pool back ends.

One home for each class: `python -m router_r1.pool.server` runs the server module as
`__main__`, so a class defined there would not be the one a back end raises.
"""
from __future__ import annotations


class BadRequest(Exception):
    """The client's mistake, answered `status` (400 unless said) with the offending field in `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


class Overloaded(Exception):
    """A back end's queue is full: the server answers 429 with Retry-After `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s
