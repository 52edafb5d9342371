"""Driver for scripts/bench-agents: real agent CLIs (unchanged, each with its own home and
telemetry off) on small tasks in throwaway repositories, against `perch serve` and against
llama.cpp's server on the same model, one after the other in one run. A task is done when its
check (a script: file contents, a test run, a program's output) passes, never by reading the
model's words. Every request goes through a recording proxy in front of the server, so both
servers are measured the same way: requests, HTTP statuses, prompt and cached tokens (from each
protocol's usage, and llama-server's `timings`), and time to the first generated token.

Prints one JSON line per (server, agent, task) and a summary table."""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_agent_tasks import TASKS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AGENTS_DIR = ROOT / ".deps/agents"


# ---- the recording proxy -------------------------------------------------------------------

# Text in a streamed event that means the model has produced something (not a role or an
# empty opening chunk).
GENERATED = ('"content":"', '"text_delta"', '"input_json_delta"', '"tool_calls":[', '"arguments":"',
             '"output_text.delta"', '"function_call_arguments.delta"', '"reasoning_content":"',
             '"response":"')
EMPTY = ('"content":""', '"arguments":""', '"response":""')


@dataclass
class Exchange:
    path: str
    status: int = 0
    started: float = 0.0
    first_token: float | None = None
    ended: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


def usage_of(obj, ex: Exchange):
    """Prompt and cached tokens from any usage object in a response (OpenAI chat and Responses,
    Anthropic, Ollama) or llama-server's `timings`."""
    if isinstance(obj, list):
        for v in obj:
            usage_of(v, ex)
        return
    if not isinstance(obj, dict):
        return
    u = obj.get("usage")
    if isinstance(u, dict):
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
        cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        cached = max(cached, u.get("cache_read_input_tokens") or 0)
        prompt = u.get("prompt_tokens") or 0
        if "input_tokens" in u:  # Anthropic counts cache reads apart; Responses includes them
            prompt = (u.get("input_tokens") or 0) + (u.get("cache_read_input_tokens") or 0)
        ex.prompt_tokens = max(ex.prompt_tokens, prompt)
        ex.cached_tokens = max(ex.cached_tokens, cached)
    t = obj.get("timings")
    if isinstance(t, dict) and "cache_n" in t:
        ex.cached_tokens = max(ex.cached_tokens, t.get("cache_n") or 0)
        ex.prompt_tokens = max(ex.prompt_tokens, (t.get("cache_n") or 0) + (t.get("prompt_n") or 0))
    if "prompt_eval_count" in obj:  # Ollama
        ex.prompt_tokens = max(ex.prompt_tokens, obj.get("prompt_eval_count") or 0)
    for v in obj.values():
        if isinstance(v, (dict, list)):
            usage_of(v, ex)


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.exchanges: list[Exchange] = []

    def since(self, t0):
        with self.lock:
            return [e for e in self.exchanges if e.started >= t0]


def proxy(upstream_port: int, recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self):
            # An agent closing its idle keep-alive connection with a reset is not an error of
            # any request: it only printed a traceback here.
            try:
                super().handle()
            except ConnectionResetError:
                pass

        def log_message(self, *a):
            pass

        def relay(self):
            ex = Exchange(path=self.path, started=time.time())
            with recorder.lock:
                recorder.exchanges.append(ex)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=3600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
            except OSError as e:
                ex.status, ex.error, ex.ended = 502, str(e), time.time()
                self.send_error(502)
                return
            ex.status = r.status
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            seen = b""
            try:
                while True:
                    chunk = r.read1(65536)
                    if not chunk:
                        break
                    seen += chunk
                    if ex.first_token is None:
                        text = chunk.decode("utf-8", "replace").replace('": "', '":"').replace('": [', '":[')
                        for e in EMPTY:
                            text = text.replace(e, "")
                        if any(g in text for g in GENERATED):
                            ex.first_token = time.time()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError as e:
                # The agent hung up mid-answer (its own timeout, a cancel): recorded, and the
                # upstream connection closed so the server cancels that generation too.
                ex.error, ex.ended = f"client closed: {e}", time.time()
                conn.close()
                self.close_connection = True
                return
            ex.ended = time.time()
            if ex.first_token is None and ex.status == 200:
                ex.first_token = ex.ended
            if ex.status >= 400:
                ex.error = seen[:300].decode("utf-8", "replace")
            for line in seen.decode("utf-8", "replace").splitlines() or [""]:
                line = line.removeprefix("data:").strip()
                if line.startswith("{") or line.startswith("["):
                    try:
                        usage_of(json.loads(line), ex)
                    except ValueError:
                        pass
            try:
                usage_of(json.loads(seen), ex)
            except ValueError:
                pass

        do_GET = do_POST = do_PUT = do_DELETE = relay

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---- the agents ----------------------------------------------------------------------------

def quiet_env(home: Path) -> dict:
    """An agent's environment: its own home, and nothing it would report or fetch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "ANTHROPIC", "AIDER", "LLM_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_CACHE_HOME=str(home / ".cache"), DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1",
               DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DO_NOT_TRACK="1",
               OPENCODE_DISABLE_AUTOUPDATE="1", NO_UPDATE_NOTIFIER="1", AIDER_ANALYTICS="false",
               AIDER_CHECK_UPDATE="false")
    return env


def claude_code(url, model, task, home):
    env = quiet_env(home) | {
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "local", "API_TIMEOUT_MS": "3600000",
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "3600000", "ANTHROPIC_MODEL": "claude-sonnet-4-5",
        "ANTHROPIC_SMALL_FAST_MODEL": "claude-haiku-4-5"}
    cmd = [str(AGENTS_DIR / "node_modules/.bin/claude"), "-p", "--model", "claude-sonnet-4-5",
           "--tools", "Read,Write,Edit,Bash", "--allowedTools", "Read,Write,Edit,Bash",
           "--permission-mode", "acceptEdits", "--max-turns", "12", "--output-format", "json", task.prompt]
    return cmd, env


def qwen_code(url, model, task, home):
    settings = home / ".qwen/settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"usageStatisticsEnabled": False, "telemetry": {"enabled": False},
                                    "security": {"auth": {"selectedType": "openai"}}}))
    env = quiet_env(home) | {"OPENAI_API_KEY": "local", "OPENAI_BASE_URL": url + "/v1", "OPENAI_MODEL": model}
    cmd = [str(AGENTS_DIR / "node_modules/.bin/qwen"), "--yolo", "--auth-type", "openai", "--openai-api-key", "local",
           "--openai-base-url", url + "/v1", "-m", model, "--max-session-turns", "12", task.prompt]
    return cmd, env


LLM_TOOLS = '''
import pathlib, subprocess
def read_file(path: str) -> str:
    "Read a text file of the project."
    return pathlib.Path(path).read_text()
def write_file(path: str, content: str) -> str:
    "Write a text file of the project (replacing it)."
    pathlib.Path(path).write_text(content)
    return "written"
def list_files() -> str:
    "The project's files."
    return "\\n".join(str(p) for p in sorted(pathlib.Path(".").rglob("*")) if p.is_file() and ".git" not in p.parts)
def run(command: str) -> str:
    "Run a shell command in the project and return its output."
    r = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    return (r.stdout + r.stderr)[-4000:] + f"\\n(exit status {r.returncode})"
'''


def llm_cli(url, model, task, home):
    path = home / "llm"
    path.mkdir(parents=True, exist_ok=True)
    (path / "extra-openai-models.yaml").write_text(
        f"- model_id: bench\n  model_name: {model}\n  api_base: {url}/v1\n  supports_tools: true\n")
    env = quiet_env(home) | {"LLM_USER_PATH": str(path), "OPENAI_API_KEY": "local"}
    cmd = [str(AGENTS_DIR / "llm-venv/bin/llm"), "-m", "bench", "--no-log", "--td", "--chain-limit", "12",
           "--functions", LLM_TOOLS, task.prompt]
    return cmd, env


def aider(url, model, task, home):
    env = quiet_env(home) | {"OPENAI_API_KEY": "local", "OPENAI_API_BASE": url + "/v1"}
    cmd = [str(AGENTS_DIR / "aider-venv/bin/aider"), "--model", f"openai/{model}", "--yes-always",
           "--no-auto-commits", "--no-check-update", "--analytics-disable", "--no-show-model-warnings",
           "--map-tokens", "0", "--edit-format", "whole", "--no-pretty", "--no-stream", "--message", task.prompt,
           *task.files]
    return cmd, env


AGENTS = {"claude-code": claude_code, "qwen-code": qwen_code, "llm": llm_cli, "aider": aider}


# ---- a run ---------------------------------------------------------------------------------

def run_task(server, upstream_port, model, agent, task, recorder, proxy_port, timeout, keep):
    work = Path(tempfile.mkdtemp(prefix=f"bench-agents-{agent}-{task.name}-"))
    repo, home = work / "repo", work / "home"
    repo.mkdir()
    home.mkdir()
    for name, text in task.files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "start"], cwd=repo, check=True)
    url = f"http://127.0.0.1:{proxy_port}"
    cmd, env = AGENTS[agent](url, model, task, home)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        rc, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", ((e.stdout or b"") + (e.stderr or b"")).decode("utf-8", "replace") if isinstance(e.stdout, bytes) else str(e.stdout or "")
    wall = time.time() - t0
    ok, why = task.check(repo)
    ex = recorder.since(t0)
    ttfts = [e.first_token - e.started for e in ex if e.first_token and e.status == 200 and "/messages/count_tokens" not in e.path]
    gen = [e for e in ex if e.status != 404 or "count_tokens" not in e.path]
    row = {
        "server": server, "agent": agent, "task": task.name, "done": ok, "check": why,
        "wall_s": round(wall, 1), "exit": rc, "requests": len(gen),
        "errors": [f"{e.status} {e.path} {e.error[:160]}" for e in ex if e.status >= 400],
        "hangups": sum(e.error.startswith("client closed") for e in ex),
        "prompt_tokens": sum(e.prompt_tokens for e in ex), "cached_tokens": sum(e.cached_tokens for e in ex),
        "ttft_s_mean": round(sum(ttfts) / len(ttfts), 2) if ttfts else None,
        "ttft_s_first": round(ttfts[0], 2) if ttfts else None,
    }
    (work / "agent-output.txt").write_text(out if isinstance(out, str) else str(out))
    if keep:
        row["work"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return row


def summary(rows):
    print("\n| server | agent | done | wall s | requests | 4xx/5xx | prompt tok | cached tok | mean TTFT s |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["server"], r["agent"]) for r in rows})
    for s, a in keys:
        rs = [r for r in rows if (r["server"], r["agent"]) == (s, a)]
        t = [r["ttft_s_mean"] for r in rs if r["ttft_s_mean"] is not None]
        print(f"| {s} | {a} | {sum(r['done'] for r in rs)}/{len(rs)} | {sum(r['wall_s'] for r in rs):.0f} | "
              f"{sum(r['requests'] for r in rs)} | {sum(len(r['errors']) for r in rs)} | "
              f"{sum(r['prompt_tokens'] for r in rs)} | {sum(r['cached_tokens'] for r in rs)} | "
              f"{(sum(t) / len(t)) if t else float('nan'):.1f} |")
    print("\n| task | " + " | ".join(f"{s}/{a}" for s, a in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name in dict.fromkeys(r["task"] for r in rows):
        cells = []
        for s, a in keys:
            r = next((r for r in rows if (r["server"], r["agent"], r["task"]) == (s, a, name)), None)
            cells.append("" if r is None else ("done" if r["done"] else "no") + f" {r['wall_s']:.0f}s")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary", type=Path, help="only print the tables of these rows (JSON lines)")
    ap.add_argument("--server", action="append", default=[], metavar="NAME=PORT",
                    help="a running server to test (perch=7393, llama-server=7394)")
    ap.add_argument("--model", help="the model id agents ask for")
    ap.add_argument("--agents", default=",".join(AGENTS))
    ap.add_argument("--tasks", default=",".join(t.name for t in TASKS))
    ap.add_argument("--timeout", type=float, default=900, help="seconds per agent and task")
    ap.add_argument("--keep", action="store_true", help="keep each task's folder and the agent's output")
    ap.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    a = ap.parse_args()
    if a.summary:
        return summary([json.loads(line) for line in a.summary.open()])
    tasks = [t for t in TASKS if t.name in a.tasks.split(",")]
    rows = []
    for spec in a.server:
        name, port = spec.split("=")
        recorder = Recorder()
        px = proxy(int(port), recorder)
        for agent in a.agents.split(","):
            for task in tasks:
                row = run_task(name, int(port), a.model, agent, task, recorder, px.server_address[1], a.timeout, a.keep)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if a.out:
                    with a.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
        px.shutdown()
    summary(rows)


if __name__ == "__main__":
    main()
