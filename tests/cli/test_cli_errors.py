"""Every user error of every subcommand, run as a real ``pykvpool`` process: exit status 2,
stderr starting with ``pykvpool: error:`` (naming the file and line where the error is in
a file), never a traceback. Also: a bug exits 70 asking for a report, a closed pipe is
quiet, and the named traces work from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path | None = None, code: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "pykvpool.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYKVPOOL_TRACEBACK", None)
    return subprocess.run([*cmd, *args], capture_output=True, text=True, check=False, cwd=cwd,
                          timeout=120, env=env)


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
LLAMA = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 8192}


def _files() -> dict[str, bytes]:
    def cfg(**kw: object) -> bytes:
        return json.dumps({**LLAMA, **kw}).encode()

    row = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    return {
        "bin": bytes(range(256)) * 8,
        "utf16.txt": "100\n200\n".encode("utf-16"),
        "utf16.json": json.dumps(LLAMA).encode("utf-16"),
        "latin1.csv": (AZURE_HEADER + "t,10,5\ncaf\u00e9,1,1\n").encode("latin-1"),
        "huge.csv": (AZURE_HEADER + "t,10,5\nt,99999999999999999999999,5\n").encode(),
        "huge.txt": b"100\n" + b"9" * 30 + b"\n",
        "digits.txt": b"9" * 5000 + b"\n",
        "nocols.csv": b"a,b,c\n1,2,3\n",
        "short.csv": (AZURE_HEADER + "t,10\n").encode(),
        "bad.jsonl": (json.dumps(row) + "\nnot json\n").encode(),
        "array.jsonl": b"[1, 2]\n",
        "deep.jsonl": b"[" * 100_000 + b"\n",
        "huge_key.jsonl": json.dumps({**row, "hash_ids": [2**70]}).encode(),
        "keys.jsonl": json.dumps({**row, "input_length": 1000}).encode(),
        "empty.txt": b"",
        "comments.txt": b"# nothing here\n\n",
        "header_only.csv": AZURE_HEADER.encode(),
        "badtime.csv": (AZURE_HEADER + "2023-11-16 18:15:46,10,5\nyesterday,10,5\n").encode(),
        "nantime.csv": b"time,prompt,output\n0,10,5\nnan,10,5\n",
        "zero_prompt.csv": b"ContextTokens,GeneratedTokens\n10,5\n0,5\n",
        "zero.txt": b"12\n0\n",
        "chunked.json": cfg(attention_chunk_size=8192),
        "layers.json": cfg(layer_types=["sliding_attention", "full_attention"]),
        "linear.json": cfg(layer_types=["linear_attention", "full_attention"] * 16),
        "mamba.json": cfg(layers_block_type=["mamba", "attention"] * 16),
        "mla.json": cfg(kv_lora_rank=512),
        "moe.json": cfg(num_local_experts=8),
        "deepseek.json": cfg(n_routed_experts=64, num_experts_per_tok=6, decoder_sparse_step=2),
        "qwenmoe.json": cfg(num_experts=60, num_experts_per_tok=4, mlp_only_layers=[0]),
        "hugeint.json": cfg(num_hidden_layers=10**30),
        "list.json": b"[1, 2]",
        "deep.json": b"[" * 100_000,
        "missing.json": json.dumps({"hidden_size": 4096}).encode(),
        "syntax.json": b'{"hidden_size": 4096,\n "num_hidden_layers": }',
    }


#: (id, arguments, expected text in stderr); {name} stands for a file of _files(), {dir}
#: for the test's folder.
CASES: list[tuple[str, list[str], str]] = [
    # --- the reproducers ---
    ("sweep-binary", ["sweep", "--trace", "{bin}"], "{bin}:1: not text"),
    ("sweep-utf16", ["sweep", "--trace", "{utf16.txt}"], "{utf16.txt}:1: UTF-16"),
    ("replay-binary", ["replay", "--trace", "{bin}"], "{bin}:1: not text"),
    ("replay-utf16", ["replay", "--trace", "{utf16.txt}"], "UTF-16"),
    ("simulate-binary", ["simulate", "--trace", "{bin}"], "{bin}:1: not text"),
    ("simulate-groups-sweep", ["simulate", "--layer-groups", "--sweep-rates", "1"], "--layer-groups does not combine"),
    ("simulate-caching-no-ids", ["simulate", "--prefix-caching", "--requests", "2"], "--prefix-caching needs"),
    ("replay-model-sweep", ["replay", "--model", "gemma-2-9b", "--sweep"], "--model takes"),
    ("replay-model-block", ["replay", "--model", "gemma-2-9b", "--block-size", "48"], "block_size must divide 512"),
    ("replay-model-retain", ["replay", "--model", "gemma-2-9b", "--retain-hits-for", "3", "--policy", "lru"],
     "retain_hits_for needs"),
    ("replay-model-all", ["replay", "--model", "gemma-2-9b", "--policy", "all"], "--model replays one"),
    ("simulate-utf16", ["simulate", "--trace", "{utf16.txt}"], "UTF-16"),
    ("hf-config-binary", ["ledger", "--hf-config", "{bin}"], "{bin}:1: not text"),
    ("hf-config-utf16", ["ledger", "--hf-config", "{utf16.json}"], "UTF-16"),
    ("sweep-huge-int", ["sweep", "--trace", "{huge.csv}"], "{huge.csv}:3: ContextTokens"),
    ("simulate-huge-int", ["simulate", "--trace", "{huge.csv}"], "{huge.csv}:3: ContextTokens"),
    ("sweep-huge-length", ["sweep", "--trace", "{huge.txt}"], "{huge.txt}:2: length"),
    ("sweep-5000-digits", ["sweep", "--trace", "{digits.txt}"], "{digits.txt}:1: length"),
    ("ledger-memory-inf", ["ledger", "--memory-gib", "inf"], "finite"),
    ("ledger-memory-1e400", ["ledger", "--memory-gib", "1e400"], "finite"),
    ("ledger-memory-nan", ["ledger", "--memory-gib", "nan"], "finite"),
    ("simulate-block-size-0", ["simulate", "--block-size", "0"], "--block-size: must be >= 1"),
    ("simulate-sweep-rates-abc", ["simulate", "--sweep-rates", "abc"], "--sweep-rates"),
    ("simulate-sweep-rates-0-neg", ["simulate", "--sweep-rates", "0,-1"], "--sweep-rates: item '0': must be > 0"),
    ("simulate-sweep-block-sizes-0", ["simulate", "--sweep-rates", "1", "--sweep-block-sizes", "0"],
     "--sweep-block-sizes"),
    ("simulate-workers-neg", ["simulate", "--sweep-rates", "1", "--workers", "-1"], "--workers"),
    ("simulate-csv-no-columns", ["simulate", "--trace", "{nocols.csv}"], "{nocols.csv}:1: no 'ContextTokens' column"),
    ("simulate-jsonl-not-json", ["simulate", "--trace", "{bad.jsonl}"], "{bad.jsonl}:2: not JSON"),
    ("simulate-requests-1e10", ["simulate", "--requests", "10000000000"], "--requests: must be <= 1,000,000"),
    ("simulate-requests-0", ["simulate", "--requests", "0"], "--requests: must be >= 1"),
    ("simulate-empty-trace", ["simulate", "--trace", "{empty.txt}"], "{empty.txt}: the file holds no request"),
    ("simulate-num-blocks-0", ["simulate", "--num-blocks", "0"], "--num-blocks: must be >= 1"),
    ("simulate-rate-0", ["simulate", "--rate", "0"], "--rate: must be > 0, got 0"),
    # --- more of the same kinds ---
    ("sweep-latin1", ["sweep", "--trace", "{latin1.csv}"], "{latin1.csv}:3: not UTF-8"),
    ("sweep-no-columns", ["sweep", "--trace", "{nocols.csv}"], "{nocols.csv}:1: no 'ContextTokens'"),
    ("sweep-short-row", ["sweep", "--trace", "{short.csv}"], "{short.csv}:2: expected 3 fields"),
    ("sweep-jsonl-array", ["sweep", "--trace", "{array.jsonl}"], "{array.jsonl}:1: expected a JSON object"),
    ("sweep-jsonl-deep", ["sweep", "--trace", "{deep.jsonl}"], "{deep.jsonl}:1: not JSON"),
    ("sweep-empty", ["sweep", "--trace", "{empty.txt}"], "holds no request"),
    ("sweep-zero-length", ["sweep", "--trace", "{zero.txt}"], "{zero.txt}:2: length 0"),
    ("sweep-dev-zero", ["sweep", "--trace", "/dev/zero"], "/dev/zero:1: not text"),
    ("sweep-directory", ["sweep", "--trace", "{dir}"], "{dir}: Is a directory"),
    ("sweep-missing-file", ["sweep", "--trace", "{dir}/nope.csv"], "No such file"),
    ("sweep-block-sizes-abc", ["sweep", "--block-sizes", "8,abc"], "--block-sizes: item 'abc'"),
    ("sweep-block-sizes-empty", ["sweep", "--block-sizes", ","], "--block-sizes"),
    ("sweep-prefix-negative", ["sweep", "--prefix", "-1"], "--prefix: must be >= 0"),
    ("sweep-max-len-0", ["sweep", "--max-len", "0"], "--max-len: must be >= 1"),
    ("sweep-columns-bad", ["sweep", "--columns", "prompt"], "--columns"),
    ("sweep-columns-missing", ["sweep", "--trace", "{nocols.csv}", "--columns", "prompt=a,output=z"],
     "{nocols.csv}:1: no 'z' column"),
    ("sweep-block-size-huge", ["sweep", "--block-size", "100000"], "--block-size: must be <= 65,536"),
    ("sweep-max-len-above-largest-block", ["sweep", "--max-len", "100000"], "pool's largest block"),
    ("sweep-block-above-capacity", ["sweep", "--memory-gib", "15", "--reserve-gib", "0"],
     "exceeds the KV capacity of 351 tokens"),
    ("sweep-all-dropped", ["sweep", "--workload", "azure-code", "--max-len", "1"],
     "every request of Azure code trace is longer than --max-len 1 tokens"),
    ("sweep-prefix-too-long", ["sweep", "--prefix", "9999"], "--prefix 9999 exceeds the shortest request"),
    ("replay-block-size-huge", ["replay", "--block-size", "131072"], "--block-size: must be <= 65,536"),
    ("replay-empty", ["replay", "--trace", "{empty.txt}"], "{empty.txt}: the file holds no request"),
    ("replay-comments", ["replay", "--trace", "{comments.txt}"], "{comments.txt}:1: not JSON"),
    ("replay-not-json", ["replay", "--trace", "{bad.jsonl}"], "{bad.jsonl}:2: not JSON"),
    ("replay-huge-key", ["replay", "--trace", "{huge_key.jsonl}"], "{huge_key.jsonl}:1: hash_ids entry"),
    ("replay-keys-mismatch", ["replay", "--trace", "{keys.jsonl}"], "{keys.jsonl}:1: 1 block ids for 1000"),
    ("replay-capacity-0", ["replay", "--capacity", "0"], "--capacity: must be >= 1"),
    ("replay-capacity-small", ["replay", "--capacity", "1"], "below the largest request"),
    ("replay-block-size-100", ["replay", "--block-size", "100"], "multiple"),
    ("replay-capacities-abc", ["replay", "--sweep", "--capacities", "abc"], "--capacities"),
    ("replay-plot-without-sweep", ["replay", "--plot", "{dir}/x.png"], "--plot needs --sweep"),
    ("replay-tiers-sweep", ["replay", "--host-blocks", "8", "--sweep"], "without --sweep or --model"),
    ("replay-tiers-priority", ["replay", "--host-blocks", "8", "--policy", "priority"], "without --sweep"),
    ("replay-disk-without-host", ["replay", "--disk-blocks", "8"], "need host_blocks"),
    ("replay-reuse-gate-0", ["replay", "--host-blocks", "8", "--reuse-gate", "0"], "--reuse-gate: must be >= 1"),
    ("replay-reuse-gate-256", ["replay", "--host-blocks", "8", "--reuse-gate", "256"], "--reuse-gate"),
    ("replay-retain-0", ["replay", "--retain-hits-for", "0"], "--retain-hits-for"),
    ("simulate-header-only", ["simulate", "--trace", "{header_only.csv}"], "a header but no request"),
    ("simulate-bad-time", ["simulate", "--trace", "{badtime.csv}"], "{badtime.csv}:3: TIMESTAMP 'yesterday'"),
    ("simulate-nan-time", ["simulate", "--trace", "{nantime.csv}", "--columns", "prompt=prompt,output=output,time=time"],
     "{nantime.csv}:3: time 'nan' is not a finite time"),
    ("simulate-zero-prompt", ["simulate", "--trace", "{zero_prompt.csv}"], "{zero_prompt.csv}:3: a prompt of 0"),
    ("simulate-keys-mismatch", ["simulate", "--trace", "{keys.jsonl}"], "{keys.jsonl}:1: 1 block keys"),
    ("simulate-latin1", ["simulate", "--trace", "{latin1.csv}"], "{latin1.csv}:3: not UTF-8"),
    ("simulate-unknown-named-trace", ["simulate", "--trace", "azure-chat"],
     "azure-chat: no such file, nor a trace shipped with pykvpool (azure-code, azure-conv, mooncake)"),
    ("simulate-sweep-rates-nan", ["simulate", "--sweep-rates", "1,nan"], "finite"),
    ("simulate-sweep-rates-empty", ["simulate", "--sweep-rates", ""], "--sweep-rates"),
    ("simulate-sweep-allocations", ["simulate", "--sweep-rates", "1", "--sweep-allocations", "paged,lazy"],
     "must be one of paged, reserve, oracle"),
    ("simulate-sweep-allocations-twice", ["simulate", "--sweep-rates", "1", "--sweep-allocations", "paged,paged"],
     "given twice"),
    ("simulate-sweep-block-too-big", ["simulate", "--sweep-rates", "1", "--num-blocks", "1",
                                      "--sweep-block-sizes", "16,32"], "block size 32 exceeds"),
    ("simulate-block-size-huge", ["simulate", "--block-size", "100000"], "--block-size: must be <= 65,536"),
    ("simulate-num-blocks-huge", ["simulate", "--num-blocks", "2000000000"], "--num-blocks: must be <= 1,073,741,824"),
    ("simulate-rate-inf", ["simulate", "--rate", "inf"], "finite"),
    ("simulate-prompt-reversed", ["simulate", "--prompt", "10", "5"], "--prompt LO HI"),
    ("simulate-output-zero", ["simulate", "--output", "0", "5"], "--output: must be >= 1"),
    ("simulate-limit-0", ["simulate", "--trace", "azure-code", "--limit", "0"], "--limit: must be >= 1"),
    ("simulate-limit-without-trace", ["simulate", "--limit", "5"], "need --trace"),
    ("simulate-requests-with-trace", ["simulate", "--trace", "azure-code", "--requests", "5"], "--limit"),
    ("simulate-columns-incomplete", ["simulate", "--trace", "{nocols.csv}", "--columns", "prompt=a"],
     "must name output"),
    ("simulate-columns-unknown-role", ["simulate", "--columns", "prompt=a,output=b,colour=c"], "unknown role"),
    ("simulate-columns-missing", ["simulate", "--trace", "azure-code", "--columns", "prompt=a,output=b"],
     "no 'a' column"),
    ("simulate-seed-negative", ["simulate", "--seed", "-1"], "--seed: must be >= 0"),
    ("simulate-max-running-0", ["simulate", "--max-running", "0"], "--max-running"),
    ("simulate-host-blocks-huge", ["simulate", "--host-blocks", "2147483647"], "--host-blocks: must be <="),
    ("simulate-host-blocks-neg", ["simulate", "--host-blocks", "-1"], "--host-blocks"),
    ("simulate-allocation-bad", ["simulate", "--allocation", "lazy"], "invalid choice"),
    ("simulate-reserve-tokens-paged", ["simulate", "--reserve-tokens", "100"], "reserve allocation only"),
    ("simulate-unknown-model", ["simulate", "--model", "gpt-9"], "unknown model 'gpt-9'"),
    ("simulate-unknown-hardware", ["simulate", "--hardware", "tpu-v9"], "unknown hardware"),
    ("simulate-budget-too-small", ["simulate", "--memory-gib", "10"], "exceed the usable"),
    ("simulate-fraction-nan", ["simulate", "--fraction", "nan"], "finite"),
    ("ledger-memory-neg-inf", ["ledger", "--memory-gib=-inf"], "finite"),
    ("ledger-memory-huge", ["ledger", "--memory-gib", "1e300"], "--memory-gib: must be <= 1,073,741,824, got 1e+300"),
    ("ledger-fraction-0", ["ledger", "--fraction", "0"], "--fraction: must be > 0, got 0"),
    ("ledger-reserve-inf", ["ledger", "--reserve-gib", "inf"], "finite"),
    ("ledger-reserve-exceeds", ["ledger", "--reserve-gib", "79"], "exceed the usable"),
    ("ledger-weight-bytes-0", ["ledger", "--weight-bytes", "0"], "--weight-bytes"),
    ("ledger-seq-len-huge", ["ledger", "--seq-len", "1" + "0" * 400], "--seq-len: must be <="),
    ("ledger-batch-abc", ["ledger", "--batch", "abc"], "'abc' is not an integer"),
    ("ledger-dtype", ["ledger", "--dtype", "int8:g0"], "granularity"),
    ("hf-config-syntax", ["ledger", "--hf-config", "{syntax.json}"], "{syntax.json}:2: not valid JSON"),
    ("hf-config-deep", ["ledger", "--hf-config", "{deep.json}"], "not valid JSON"),
    ("hf-config-list", ["ledger", "--hf-config", "{list.json}"], "expected a JSON object"),
    ("hf-config-missing-key", ["ledger", "--hf-config", "{missing.json}"], "has no 'num_hidden_layers'"),
    ("hf-config-huge-int", ["ledger", "--hf-config", "{hugeint.json}"], "'num_hidden_layers' must be in"),
    ("hf-config-chunked-which-layers", ["ledger", "--hf-config", "{chunked.json}"],
     "'attention_chunk_size' = 8192: chunked attention without layer_types"),
    ("hf-config-layer-types-count", ["ledger", "--hf-config", "{layers.json}"], "'layer_types'"),
    ("hf-config-linear-attention", ["ledger", "--hf-config", "{linear.json}"], "'layer_types' = ['linear_attention'"),
    ("hf-config-mamba", ["ledger", "--hf-config", "{mamba.json}"], "'layers_block_type' = ['mamba'"),
    ("hf-config-mla-no-rope", ["ledger", "--hf-config", "{mla.json}"], "has no 'qk_rope_head_dim'"),
    ("hf-config-mixtral-no-top-k", ["ledger", "--hf-config", "{moe.json}"], "has no 'num_experts_per_tok'"),
    ("hf-config-sparse-step", ["ledger", "--hf-config", "{deepseek.json}"], "'decoder_sparse_step' = 2"),
    ("hf-config-mlp-only-layers", ["ledger", "--hf-config", "{qwenmoe.json}"], "'mlp_only_layers' = [0]"),
    ("hf-config-directory", ["ledger", "--hf-config", "{dir}"], "Is a directory"),
    ("video-seconds-0", ["video", "--seconds", "0"], "--seconds: must be > 0"),
    ("video-seconds-huge", ["video", "--seconds", "1e6"], "--seconds: must be <="),
    ("video-seconds-nan", ["video", "--seconds", "nan"], "finite"),
    ("video-unknown-model", ["video", "--models", "sora"], "--models: item 'sora'"),
    ("video-model-twice", ["video", "--models", "longlive,longlive"], "given twice"),
    ("video-unknown-hardware", ["video", "--hardware", "tpu-v9"], "--hardware: item 'tpu-v9'"),
    ("video-window-negative", ["video", "--window", "-1"], "--window: must be >= 0"),
    ("video-sinks-huge", ["video", "--sinks", "1000000"], "--sinks: must be <="),
    ("video-block-size-0", ["video", "--block-size", "0"], "--block-size: must be >= 1"),
    ("video-budget-too-small", ["video", "--models", "magi-1-like", "--memory-gib", "40"],
     "leave no room for KV"),
    ("no-subcommand", [], "the following arguments are required"),
    ("unknown-subcommand", ["frobnicate"], "invalid choice"),
    ("report-out-is-a-file", ["report", "--no-measure", "--quiet", "--out", "{empty.txt}"], "{empty.txt}"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("inputs")
    out = {"dir": str(d)}
    for name, data in _files().items():
        (d / name).write_bytes(data)
        out[name] = str(d / name)
    return out


def _fill(text: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_error_exits_2_with_one_message(files: dict[str, str], args: list[str], expected: str) -> None:
    r = run(*(_fill(a, files) for a in args))
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stderr.startswith("pykvpool: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert _fill(expected, files) in r.stderr, r.stderr


def test_case_ids_are_unique() -> None:
    assert len({c[0] for c in CASES}) == len(CASES)


def test_seq_len_beyond_the_context_warns_once(files: dict[str, str]) -> None:
    r = run("ledger", "--seq-len", "100000")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("pykvpool: warning: --seq-len 100,000 exceeds Llama-3-8B's context window")


def test_seq_len_beyond_an_hf_configs_context_warns(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA, "max_position_embeddings": 4096}))
    r = run("ledger", "--hf-config", str(f), "--seq-len", "8192")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("pykvpool: warning: --seq-len 8,192 exceeds config's context window "
                        "(max_position_embeddings = 4,096)\n")
    assert run("ledger", "--hf-config", str(f), "--seq-len", "4096").stderr == ""


def test_dense_full_attention_configs_are_still_accepted(tmp_path: Path) -> None:
    """Qwen2.5's sliding_window is switched off by use_sliding_window; layer_types of
    full attention only, null window and one expert are the dense case too."""
    cases = [{"sliding_window": 131072, "use_sliding_window": False},
             {"sliding_window": None, "layer_types": ["full_attention"] * 32},
             {"sliding_window": 8192, "max_position_embeddings": 8192},
             {"num_experts": None, "kv_lora_rank": None, "num_local_experts": 1}]
    for i, extra in enumerate(cases):
        f = tmp_path / f"c{i}.json"
        f.write_text(json.dumps({**LLAMA, **extra}))
        r = run("ledger", "--hf-config", str(f))
        assert r.returncode == 0, (extra, r.stderr)
        assert "KV per token     131072 B" in r.stdout


def test_a_bug_exits_70_and_asks_for_a_report() -> None:
    code = ("import sys, pykvpool.cli.ledger as c\n"
            "from pykvpool import InvariantError\n"
            "from pykvpool.cli import main\n"
            "def boom(args): raise InvariantError('pool accounting is off by one')\n"
            "c.main_ledger = boom\n"
            "sys.exit(main(['ledger']))\n")
    r = run(code=code)
    assert r.returncode == 70
    assert r.stderr.startswith("pykvpool: internal error: InvariantError: pool accounting is off by one")
    assert "please report it" in r.stderr and "Traceback" not in r.stderr
    other = run(code=code.replace("InvariantError('pool accounting is off by one')", "ZeroDivisionError('x')"))
    assert other.returncode == 70 and "internal error: ZeroDivisionError" in other.stderr


def test_a_bug_shows_its_traceback_on_request() -> None:
    code = ("import sys, pykvpool.cli.ledger as c\n"
            "from pykvpool.cli import main\n"
            "def boom(args): raise RuntimeError('x')\n"
            "c.main_ledger = boom\n"
            "sys.exit(main(['ledger']))\n")
    env_code = "import os; os.environ['PYKVPOOL_TRACEBACK'] = '1'\n" + code
    r = run(code=env_code)
    assert r.returncode == 1 and "Traceback" in r.stderr and "RuntimeError: x" in r.stderr


def test_stdout_closed_before_the_first_write_is_quiet() -> None:
    """The reader went away (``| head -1`` after its line): no BrokenPipeError noise."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run([sys.executable, "-m", "pykvpool.cli", "ledger"], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=env, check=False)
    finally:
        os.close(write_end)
    assert r.stderr == ""
    assert r.returncode == 141


def test_piped_into_head_is_quiet() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"'{sys.executable}' -m pykvpool.cli sweep --quiet --block-sizes 1,2,4,8,16,32,64,128,256 | head -1"
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert r.returncode == 0
    assert r.stdout.startswith("budget") and r.stdout.count("\n") == 1
    assert r.stderr == ""


@pytest.mark.parametrize("args", [
    ["simulate", "--trace", "mooncake", "--limit", "50", "--num-blocks", "4000"],
    ["simulate", "--trace", "azure-conv", "--limit", "50"],
    ["simulate", "--trace", "azure-code", "--limit", "50"],
    ["replay", "--policy", "lru", "--capacity", "2000"],
    ["replay", "--trace", "mooncake", "--policy", "fifo"],
    ["sweep", "--workload", "azure-code", "--quiet"],
], ids=lambda a: "-".join(a[:3]))
def test_named_traces_work_from_any_folder(tmp_path: Path, args: list[str]) -> None:
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []
