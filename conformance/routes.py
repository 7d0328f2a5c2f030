#!/usr/bin/env python3
"""List the HTTP routes an engine's own FastAPI app registers, or check them against a fixture.

Run it with the python of a venv that has the engine installed (install.sh's venvs):
  routes.py sglang [--env K=V]... [--args --enable-metrics]
  routes.py vllm   [--env K=V]... [--tasks generate] [--model-config] [--args SERVE_ARGS...]
  ... --check tests/fixtures/engines/routes/vllm-0.32.tsv
Or, for a version whose engine is not installed, against its unpacked sources (any python):
  routes.py static --src DIR --check tests/fixtures/engines/routes/vllm-0.34.tsv
  (DIR: e.g. `unzip vllm-0.34.0-*.whl 'vllm/entrypoints/*' -d DIR`; no torch needed)

sglang: imports sglang.srt.entrypoints.http_server and reads its module-level `app` (routes are
added at import; --env is applied first, e.g. DUMPER_SERVER_PORT=reuse). `--enable-metrics` among
--args also appends the /metrics mount the way the server's lifespan does.
vllm: parses --args with vLLM's own serve parser and calls build_app(args, tasks, model_config)
as `vllm serve` does (model_config only with --model-config, which needs the model's config).

Prints `method<TAB>path` sorted by path then method: APIRoute/Route methods (HEAD included as the
app reports it), WS for a WebSocket route, MOUNT for a Mount (a prefix). --check FILE exits 1
naming every route the app registers that FILE (same TSV shape, `#` comments, header) lacks, and
warns about FILE's routes the app does not register. Engine logs go to stderr.

static reads every route decorator and registration call with a literal path in DIR's Python
files (`@router.post("/x")`, `app.add_api_route("/x", ...)`, `.websocket`, `.mount`) without
importing anything: it sees no route added without a literal path (FastAPI's docs pages, the
SageMaker aliases), which the app check above does, and lists a route whatever condition adds
it. Files under a `launchers/dp_supervisor.py` (the data-parallel supervisor's own app) are
left out, as the fixtures leave them. With --check it fails on any route it finds that FILE
does not list, and, for every mode, on any FILE row whose class is not inference, read or
control (a route the tables leave unclassified).
"""
import argparse
import contextlib
import os
import sys
import tempfile


def build_sglang(passthrough):
    from sglang.srt.entrypoints import http_server

    app = http_server.app
    if "--enable-metrics" in passthrough:
        # lifespan(): `if enable_metrics: add_prometheus_middleware(app)`; prometheus_client's
        # multiprocess collector needs its directory, which launch_server normally sets.
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp())
        http_server.add_prometheus_middleware(app)
    return app


def build_vllm(passthrough, tasks, with_model_config):
    try:
        from vllm.entrypoints.openai.api_server import build_app
    except ImportError:
        from vllm.entrypoints.launchers.app import build_app
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="routes.py"))
    args = parser.parse_args(passthrough)
    if getattr(args, "model_tag", None):  # what `vllm serve MODEL` does
        args.model = args.model_tag
    try:
        validate_parsed_serve_args(args)
    except Exception as e:  # the routes do not depend on it; say so and go on
        print(f"routes.py: validate_parsed_serve_args: {e}", file=sys.stderr)
    model_config = None
    if with_model_config:
        from vllm.engine.arg_utils import AsyncEngineArgs

        model_config = AsyncEngineArgs.from_cli_args(args).create_model_config()
    return build_app(args, tasks, model_config)


STATIC_METHODS = {
    "get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE", "patch": "PATCH",
    "head": "HEAD", "websocket": "WS", "mount": "MOUNT",
}
CLASSES = ("inference", "read", "control")


def static_routes(src):
    """(method, path) for every literal route registration in SRC's Python files."""
    import ast

    rows = set()
    for folder, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            if path.replace(os.sep, "/").endswith("launchers/dp_supervisor.py"):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError) as e:
                print(f"routes.py: skipped {path}: {e}", file=sys.stderr)
                continue
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                first = node.args[0] if node.args else None
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)
                        and first.value.startswith("/")):
                    continue
                attr = node.func.attr
                if attr in STATIC_METHODS:
                    rows.add((STATIC_METHODS[attr], first.value))
                elif attr in ("add_api_route", "api_route"):
                    methods = next((k.value for k in node.keywords if k.arg == "methods"), None)
                    listed = [e.value for e in getattr(methods, "elts", [])
                              if isinstance(e, ast.Constant)]
                    rows.update((m.upper(), first.value) for m in (listed or ["GET"]))
                elif attr == "add_api_websocket_route":
                    rows.add(("WS", first.value))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def unclassified_rows(fn):
    """FILE's rows whose class column is not one of CLASSES."""
    bad = []
    with open(fn, encoding="utf-8") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if not line.strip() or line.startswith("#") or cols[:2] == ["method", "path"]:
                continue
            if len(cols) < 3 or cols[2] not in CLASSES:
                bad.append(tuple(cols[:2]))
    return bad


def enumerate_routes(app):
    from starlette.routing import Mount, WebSocketRoute

    rows = set()
    for route in app.routes:
        path = getattr(route, "path", None)
        if isinstance(route, Mount):
            rows.add(("MOUNT", path))
        elif isinstance(route, WebSocketRoute):  # FastAPI's APIWebSocketRoute is a subclass
            rows.add(("WS", path))
        elif getattr(route, "methods", None):
            rows.update((m.upper(), path) for m in route.methods)
        else:  # a Route over a raw ASGI app answers every method; anything else: name its type
            rows.add(("ANY" if hasattr(route, "methods") else type(route).__name__, path))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def read_fixture(fn):
    listed = {}
    with open(fn, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            cols = line.split("\t")
            if cols[:2] == ["method", "path"]:
                continue
            listed[(cols[0], cols[1])] = cols[3] if len(cols) > 3 else ""
    return listed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", choices=["sglang", "vllm", "static"])
    ap.add_argument("--src", metavar="DIR", help="static: the unpacked sources to read")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="set before the engine is imported (repeatable)")
    ap.add_argument("--tasks", default="generate",
                    help="vllm: comma-separated supported_tasks (default generate)")
    ap.add_argument("--model-config", action="store_true",
                    help="vllm: build ModelConfig from --args (needs the model's config; pooling routes)")
    ap.add_argument("--check", metavar="FILE", help="compare with a routes TSV; exit 1 on unlisted routes")
    ap.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                    help="everything after it goes to the engine's argument parser")
    opts = ap.parse_args()

    for kv in opts.env:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--env wants K=V, got {kv!r}")
        os.environ[key] = value

    # Engines log to stdout (vLLM's default handler): keep stdout for the TSV.
    with contextlib.redirect_stdout(sys.stderr):
        if opts.engine == "static":
            if not opts.src:
                ap.error("static wants --src DIR")
            rows = static_routes(opts.src)
        elif opts.engine == "sglang":
            app = build_sglang(opts.args)
        else:
            tasks = tuple(t for t in opts.tasks.split(",") if t)
            app = build_vllm(opts.args, tasks, opts.model_config)
        if opts.engine != "static":
            rows = enumerate_routes(app)

    if not opts.check:
        print("method\tpath")
        for method, path in rows:
            print(f"{method}\t{path}")
        return 0

    listed = read_fixture(opts.check)
    unclassified = unclassified_rows(opts.check)
    for method, path in unclassified:
        print(f"UNCLASSIFIED\t{method}\t{path}")
    registered = set(rows)
    unlisted = [r for r in rows if r not in listed]
    gone = sorted((r for r in listed if r not in registered), key=lambda r: (r[1], r[0]))
    for method, path in gone:
        cond = listed[(method, path)]
        why = "" if cond.startswith("always") else f" (condition: {cond})"
        print(f"warning: listed but not registered: {method} {path}{why}", file=sys.stderr)
    for method, path in unlisted:
        print(f"UNLISTED\t{method}\t{path}")
    print(f"routes.py: {len(rows)} registered, {len(unlisted)} unlisted, {len(gone)} listed but "
          f"not registered", file=sys.stderr)
    return 1 if unlisted or unclassified else 0


if __name__ == "__main__":
    sys.exit(main())
