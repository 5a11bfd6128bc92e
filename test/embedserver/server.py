"""An OpenAI-compatible embeddings server over WordLlama, for tests.

POST /v1/embeddings {"model": M, "input": "text" | ["text", ...]} answers
{"object": "list", "data": [{"object": "embedding", "index": i,
"embedding": [...]}, ...], "model": M, "usage": {...}}, as the HTTP
embedder expects. The models are WordLlama's l2_supercat weights, which
ship inside the wheel (nothing is downloaded), at two dimensions:

    wordllama-l2-supercat-256   the full 256 dimensions
    wordllama-l2-supercat-128   the same model truncated to 128 (Matryoshka)

so a test can change the embedding model, and its dimension, for real.

Usage: server.py [--host 127.0.0.1] [--port 0] [--api-key KEY]. Once the
models are loaded it prints "listening on HOST:PORT" on stdout, then serves
until it is terminated. With --api-key, a request without
"Authorization: Bearer KEY" is refused with 401.
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pathlib import Path

import wordllama
from wordllama import WordLlama

MAX_INPUTS = 2048
MAX_BODY = 32 << 20

MODELS = {
    "wordllama-l2-supercat-256": 256,
    "wordllama-l2-supercat-128": 128,
}


def load_models():
    # The wheel holds weights/ and tokenizers/; wordllama 0.4.0 looks for
    # the tokenizer in a tokenizer/ directory beside its module, so it is
    # pointed at the package as its cache, where it looks in tokenizers/.
    package = Path(wordllama.__file__).parent
    models = {}
    for name, dim in MODELS.items():
        models[name] = WordLlama.load(config="l2_supercat", dim=256, trunc_dim=dim if dim != 256 else None,
                                      cache_dir=package, disable_download=True)
    return models


class Handler(BaseHTTPRequestHandler):
    server_version = "converge-embedserver/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: tests read stderr on failure only
        if self.server.verbose:
            sys.stderr.write("embedserver: " + (fmt % args) + "\n")

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, kind, message):
        self.answer(status, {"error": {"message": message, "type": kind}})

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self.answer(200, {"object": "list", "data": [
                {"id": m, "object": "model", "owned_by": "wordllama"} for m in MODELS]})
            return
        self.error(404, "not_found", "no such route: GET " + self.path)

    def do_POST(self):
        if self.path.rstrip("/") != "/v1/embeddings":
            self.error(404, "not_found", "no such route: POST " + self.path)
            return
        key = self.server.api_key
        if key and self.headers.get("Authorization", "") != "Bearer " + key:
            self.error(401, "invalid_api_key", "a bearer token is required")
            return
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            self.error(413, "invalid_request_error", "the body must have a Content-Length of at most %d bytes" % MAX_BODY)
            return
        try:
            req = json.loads(self.rfile.read(n) or b"null")
        except ValueError as e:
            self.error(400, "invalid_request_error", "the body is not JSON: %s" % e)
            return
        if not isinstance(req, dict):
            self.error(400, "invalid_request_error", "the body must be a JSON object")
            return
        name = req.get("model")
        model = self.server.models.get(name)
        if model is None:
            self.error(404, "model_not_found", "model %r does not exist; this server has %s" % (name, ", ".join(MODELS)))
            return
        texts = req.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or len(texts) > MAX_INPUTS or \
                not all(isinstance(t, str) for t in texts):
            self.error(400, "invalid_request_error", "input must be a string or a list of 1 to %d strings" % MAX_INPUTS)
            return
        with self.server.lock:  # the tokenizer and numpy calls are not shared across threads
            vectors = model.embed(texts, norm=True)
        data = [{"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                for i, v in enumerate(vectors)]
        tokens = sum(len(t.split()) for t in texts)
        self.answer(200, {"object": "list", "data": data, "model": name,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api-key", default="")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.daemon_threads = True
    srv.models = load_models()
    srv.api_key = args.api_key
    srv.verbose = args.verbose
    srv.lock = threading.Lock()
    host, port = srv.server_address[:2]
    print("listening on %s:%d" % (host, port), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
