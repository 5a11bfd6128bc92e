"""Schemathesis hooks for the writer's API (make fuzz).

- Bodies of application/x-ndjson are sent as NDJSON: the spec describes a
  batch's lines as an array, each item one line.
- The batch's answer, NDJSON, is read as the array of its lines, so that
  Schemathesis validates it against the spec like any other answer; a
  check here adds that there is one result a non-blank input line, in
  order.
- Every write the writer accepted (each applied result, and each
  re-emission) is appended to CONVERGE_ACCEPTED_LOG, one JSON object a
  line, so that the test can check afterwards that Postgres holds nothing
  else: nothing stored from a refused request.
"""

import json
import os

import schemathesis

NDJSON = "application/x-ndjson"

_accepted_log = os.environ.get("CONVERGE_ACCEPTED_LOG")


def _lines(content):
    return [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]


@schemathesis.deserializer(NDJSON)
def ndjson_answer(ctx, response):
    return _lines(response.content)


@schemathesis.serializer(NDJSON)
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8", "surrogatepass")


def _record(entries):
    if not _accepted_log or not entries:
        return
    with open(_accepted_log, "a", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def _nonblank_lines(body):
    if body is None:
        return None
    if isinstance(body, (bytes, str)):
        return None  # a raw body: its lines are not known here
    items = body if isinstance(body, list) else [body]
    return len(items)


@schemathesis.check
def batch_answers_every_line(ctx, response, case):
    if case.operation.path != "/v1/documents:batch" or response.status_code != 200:
        return None
    results = _lines(response.content)
    lines = [r["line"] for r in results]
    if lines != sorted(lines) or len(set(lines)) != len(lines):
        raise AssertionError(f"result lines out of order or repeated: {lines}")
    expected = _nonblank_lines(case.body)
    stopped = any(r.get("error", {}).get("code") in ("store_unavailable", "unavailable") for r in results)
    if expected is not None and not stopped and len(results) != expected:
        raise AssertionError(f"{expected} lines sent, {len(results)} results")
    _record([{"key": r["key"], "version": r["version"], "event_id": r["event_id"], "result": r["result"]}
             for r in results if "result" in r])
    return None


@schemathesis.check
def accepted_writes_are_recorded(ctx, response, case):
    if response.status_code != 200:
        return None
    path, method = case.operation.path, case.method.upper()
    if path == "/v1/documents/{key}" and method in ("PUT", "DELETE"):
        r = response.json()
        _record([{"key": r["key"], "version": r["version"], "event_id": r["event_id"], "result": r["result"]}])
    elif path == "/v1/admin/reemit":
        r = response.json()
        _record([{"key": d["key"], "version": d["version"], "event_id": d["event_id"], "result": "reemitted"}
                 for d in r.get("reemitted", [])])
    return None
