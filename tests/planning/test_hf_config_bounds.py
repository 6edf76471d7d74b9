"""Absurd ``config.json`` files through ``pykvpool ledger --hf-config``: whatever a config
holds, the command ends in bounded time and memory with status 0, or status 2 and one
``pykvpool: error:`` line -- never a traceback, an internal error, an out-of-memory or a
kill. Each case runs the real CLI in a child process under a timeout and an address-space
limit (``RLIMIT_AS``); the layer counts of repeating patterns are counted arithmetically,
and the reader's rules are checked against per-layer lists built here."""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pykvpool
from pykvpool.planning.models import LayerGroup, ModelConfig
from pykvpool.planning.pool_groups import MAX_POOL_GROUPS, pool_layout

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 3 << 30
"""Address space of a child (bytes): the CLI on any config needs far less."""
TIMEOUT = 60.0

#: A model whose layers weigh next to nothing, so that even 2**31 - 1 of them fit a budget.
TINY: dict[str, Any] = {"hidden_size": 1, "head_dim": 1, "intermediate_size": 0, "num_attention_heads": 1,
                        "num_key_value_heads": 1, "vocab_size": 1, "max_position_embeddings": 8192}
BIG = 2**31 - 1
DEEP = {"a": [[[[[[[[]]]]]]]]}


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``pykvpool args`` in a child under the time and memory limits."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYKVPOOL_TRACEBACK", None)
    try:
        return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                              timeout=TIMEOUT, env=env, preexec_fn=_limit_memory, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pykvpool {' '.join(args)} ran past {TIMEOUT} s")


def assert_clean(r: subprocess.CompletedProcess[str], what: str) -> None:
    """Exit 0, or exit 2 with one error line that is no out-of-memory."""
    assert r.returncode in (0, 2), f"{what}: exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, what
    if r.returncode == 2:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pykvpool: error: "), f"{what}: {r.stderr[-2000:]}"
        assert "out of memory" not in lines[0], f"{what}: {lines[0]}"
        assert len(lines[0]) < 1000, f"{what}: a message of {len(lines[0])} characters"


def write(tmp_path: Path, name: str, text: str) -> str:
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return str(f)


# --- the reproducers: 2**31 - 1 layers by every rule that decides the layer kinds --------

HUGE_LAYERS = {
    "all-full": {},
    "all-sliding": {"sliding_window": 4096},
    "pattern": {"sliding_window": 4096, "sliding_window_pattern": 6},
    "pattern-huge": {"sliding_window": 4096, "sliding_window_pattern": BIG},
    "gemma2": {"sliding_window": 4096, "model_type": "gemma2"},
    "max-window-layers": {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 1},
    "window-past-context": {"sliding_window": 10**6, "sliding_window_pattern": 6},
}


@pytest.mark.parametrize("extra", HUGE_LAYERS.values(), ids=HUGE_LAYERS.keys())
@pytest.mark.parametrize("groups", [False, True], ids=["ledger", "groups"])
def test_two_billion_layers_end_in_bounded_time_and_memory(tmp_path: Path, extra: dict[str, Any],
                                                           groups: bool) -> None:
    cfg = write(tmp_path, "config.json", json.dumps({**TINY, "num_hidden_layers": BIG, **extra}))
    r = run_cli("ledger", "--hf-config", cfg, *(["--groups"] if groups else []))
    assert_clean(r, str(extra))
    if not groups:
        assert r.returncode == 0, r.stderr
        assert f"L={BIG}" in r.stdout


def test_the_pattern_counts_of_two_billion_layers(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.json", json.dumps({**TINY, "num_hidden_layers": BIG, **HUGE_LAYERS["pattern"]}))
    r = run_cli("ledger", "--hf-config", cfg)
    assert r.returncode == 0, r.stderr
    full = BIG // 6
    assert f"layers           {BIG - full} sliding (4,096) + {full} full" in r.stdout


def test_groups_beyond_what_a_hybrid_pool_holds_are_refused_naming_the_count(tmp_path: Path) -> None:
    cfg = write(tmp_path, "config.json", json.dumps({**TINY, "num_hidden_layers": BIG, **HUGE_LAYERS["pattern-huge"]}))
    r = run_cli("ledger", "--hf-config", cfg, "--groups")
    assert r.returncode == 2
    assert f"at most {MAX_POOL_GROUPS}" in r.stderr and f"{BIG:,} groups" in r.stderr


# --- every key the reader reads, with absurd values -----------------------------------

LLAMA: dict[str, Any] = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                         "max_position_embeddings": 8192}
KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
        "intermediate_size", "vocab_size", "max_position_embeddings", "sliding_window", "use_sliding_window",
        "sliding_window_pattern", "max_window_layers", "model_type", "layer_types", "attention_chunk_size",
        "no_rope_layers", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
        "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
        "experts_per_token", "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace",
        "decoder_sparse_step", "mlp_only_layers", "tie_word_embeddings", "text_config", "_name_or_path"]
VALUES: list[Any] = [0, -1, 1, 6, 2**31 - 1, 2**31, 2**63, 10**30, 1.5, 6.0, 1e308, True, False, None, "6",
                     "gemma2", [], {}, [1, 0, 1], ["sliding_attention"] * 3, "x" * 100_000, DEEP]
DEEP_VALUE = "@DEEP@"  # replaced by nesting as deep as the JSON reader accepts


def _config_text(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg).replace(json.dumps(DEEP_VALUE), _deep(900))


@pytest.mark.parametrize("key", KEYS)
def test_each_key_with_absurd_values_ends_cleanly(tmp_path: Path, key: str) -> None:
    """One child per key runs the CLI in-process over every value (each run is a
    ``main()`` call): statuses 0 or 2, one error line, no out-of-memory."""
    cases = []
    for value in [*VALUES, DEEP_VALUE]:
        for base in (LLAMA, {**TINY, "num_hidden_layers": BIG, "sliding_window": 4096}):
            cases.append(write(tmp_path, f"c{len(cases)}.json", _config_text({**base, key: value})))
    _run_many(tmp_path, [["ledger", "--hf-config", c, "--groups"] for c in cases])


def _run_many(tmp_path: Path, argvs: list[list[str]]) -> None:
    """Every argv through ``pykvpool.cli.main.main`` in one child under the limits;
    each run's status and stderr are checked by :func:`assert_clean`."""
    code = (
        "import contextlib, io, json, sys\n"
        "from pykvpool.cli.main import main\n"
        "out = []\n"
        "for argv in json.load(open(sys.argv[1])):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        status = main(argv)\n"
        "    out.append([status, err.getvalue()])\n"
        "json.dump(out, open(sys.argv[2], 'w'))\n")
    argv_file, out_file = tmp_path / "argv.json", tmp_path / "out.json"
    argv_file.write_text(json.dumps(argvs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYKVPOOL_TRACEBACK", None)
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(argv_file), str(out_file)], capture_output=True,
                              text=True, timeout=TIMEOUT * 3, env=env, preexec_fn=_limit_memory, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{len(argvs)} runs did not end within {TIMEOUT * 3} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for argv, (status, err) in zip(argvs, json.loads(out_file.read_text())):
        config = Path(argv[2]).read_text()[:300]
        assert_clean(subprocess.CompletedProcess(argv, status, "", err), config)


def test_random_configs_end_cleanly(tmp_path: Path) -> None:
    """Seeded random mutations of real configs (two to four keys at once)."""
    rng = random.Random(2024)
    bases = [LLAMA, {**TINY, "num_hidden_layers": BIG},
             {**LLAMA, "sliding_window": 4096, "sliding_window_pattern": 6},
             {**LLAMA, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "n_routed_experts": 8, "num_experts_per_tok": 2}]
    argvs = []
    for i in range(120):
        cfg = dict(rng.choice(bases))
        for key in rng.sample(KEYS, rng.randint(2, 4)):
            cfg[key] = rng.choice([*VALUES, DEEP_VALUE])
        argvs.append(["ledger", "--hf-config", write(tmp_path, f"r{i}.json", _config_text(cfg)),
                      *(["--groups"] if i % 2 else [])])
    _run_many(tmp_path, argvs)


@pytest.mark.parametrize(("name", "text"), [
    ("top-list", "[1, 2]"), ("top-string", '"config"'), ("top-number", "7"), ("top-null", "null"),
    ("deep-object", '{"a": ' * 100_000), ("deep-list", _deep(100_000)), ("deep-accepted", _deep(900)),
    ("nested-text-config", json.dumps({"text_config": {"text_config": LLAMA}})),
    ("text-config-list", json.dumps({"text_config": [LLAMA]})),
])
def test_malformed_json_shapes_end_cleanly(tmp_path: Path, name: str, text: str) -> None:
    r = run_cli("ledger", "--hf-config", write(tmp_path, "config.json", text))
    assert_clean(r, name)
    assert r.returncode == 2


# --- the reader's rules, counted arithmetically, against per-layer lists ---------------

def _by_list(kinds: list[str], window: int) -> tuple[LayerGroup, ...]:
    order = list(dict.fromkeys(kinds))
    if order == ["full"]:
        return ()
    return tuple(LayerGroup(k, kinds.count(k), None if k == "full" else window) for k in order)


@pytest.mark.parametrize("layers", [1, 2, 3, 5, 6, 7, 12, 13, 48])
def test_pattern_rules_count_like_their_per_layer_lists(layers: int) -> None:
    base = {**LLAMA, "num_hidden_layers": layers, "sliding_window": 512}
    for n in (1, 2, 3, 6, 7, 50):
        got = ModelConfig.from_hf_config({**base, "sliding_window_pattern": n}).layer_groups
        assert got == _by_list(["full" if (i + 1) % n == 0 else "sliding" for i in range(layers)], 512), n
    got = ModelConfig.from_hf_config({**base, "model_type": "gemma2"}).layer_groups
    assert got == _by_list(["sliding" if i % 2 == 0 else "full" for i in range(layers)], 512)
    for first in (0, 1, 2, layers - 1, layers, layers + 5):
        cfg = {**base, "use_sliding_window": True, "max_window_layers": first}
        want = _by_list(["sliding" if i >= first else "full" for i in range(layers)], 512)
        assert ModelConfig.from_hf_config(cfg).layer_groups == want, first


def test_listed_kinds_keep_their_order_of_first_appearance() -> None:
    types = ["full_attention", "sliding_attention", "chunked_attention", "sliding_attention"]
    cfg = {**LLAMA, "num_hidden_layers": 4, "layer_types": types, "sliding_window": 64,
           "attention_chunk_size": 128}
    assert ModelConfig.from_hf_config(cfg).layer_groups == (
        LayerGroup("full", 1), LayerGroup("sliding", 2, 64), LayerGroup("chunked", 1, 128))
    # A window as long as the context makes the sliding layers full: they join the full group.
    cfg = {**cfg, "sliding_window": 8192, "layer_types": types[::-1]}
    assert ModelConfig.from_hf_config(cfg).layer_groups == (LayerGroup("full", 3), LayerGroup("chunked", 1, 128))


@pytest.mark.parametrize(("extra", "key"), [
    ({"sliding_window": 64, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    ({"sliding_window": 64, "sliding_window_pattern": -6}, "sliding_window_pattern"),
    ({"sliding_window": 64, "sliding_window_pattern": 6.0}, "sliding_window_pattern"),
    ({"sliding_window": 64, "sliding_window_pattern": True}, "sliding_window_pattern"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"sliding_window": 64.0}, "sliding_window"),
    ({"sliding_window": 64, "use_sliding_window": "yes"}, "use_sliding_window"),
    ({"sliding_window": 64, "use_sliding_window": True, "max_window_layers": -1}, "max_window_layers"),
    ({"num_hidden_layers": 32.0}, "num_hidden_layers"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"head_dim": 2**31}, "head_dim"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ({"model_type": ["gemma2"]}, "model_type"),
    ({"_name_or_path": {"a": 1}}, "_name_or_path"),
    ({"attention_chunk_size": 64, "no_rope_layers": [2] * 32}, "no_rope_layers"),
    ({"attention_chunk_size": 64, "no_rope_layers": [0.5] * 32}, "no_rope_layers"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1.0}, "decoder_sparse_step"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": True}, "decoder_sparse_step"),
])
def test_bad_values_are_refused_naming_the_key(extra: dict[str, Any], key: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=f"'{key}'"):
        ModelConfig.from_hf_config({**LLAMA, **extra})


def test_a_refusal_shows_a_short_value_whatever_it_holds() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    for value in (deep, list(range(10**6)), "x" * 10**6):
        with pytest.raises(pykvpool.InvalidArgumentError) as e:
            ModelConfig.from_hf_config({**LLAMA, "num_hidden_layers": value})
        assert "'num_hidden_layers'" in str(e.value) and len(str(e.value)) < 200


def test_a_config_that_is_no_mapping_is_a_type_error() -> None:
    for bad in ([1, 2], "config", 7, None):
        with pytest.raises(TypeError, match="config"):
            ModelConfig.from_hf_config(bad)  # type: ignore[arg-type]


def test_more_groups_than_a_pool_holds_are_refused() -> None:
    ok = ModelConfig("x", MAX_POOL_GROUPS, 1, 1, 8, 1e6,
                     layer_groups=(LayerGroup("sliding", MAX_POOL_GROUPS - 1, 64), LayerGroup("full", 1)))
    assert len(pool_layout(ok).groups) == MAX_POOL_GROUPS
    over = ModelConfig("x", MAX_POOL_GROUPS + 1, 1, 1, 8, 1e6,
                       layer_groups=(LayerGroup("sliding", MAX_POOL_GROUPS, 64), LayerGroup("full", 1)))
    with pytest.raises(pykvpool.InvalidArgumentError, match=f"{MAX_POOL_GROUPS + 1} groups"):
        pool_layout(over)


def test_max_pool_groups_is_the_hybrid_pools_limit() -> None:
    pykvpool.BlockPool(1, 1, [pykvpool.FullAttention()] * MAX_POOL_GROUPS)
    with pytest.raises(pykvpool.InvalidArgumentError):
        pykvpool.BlockPool(1, 1, [pykvpool.FullAttention()] * (MAX_POOL_GROUPS + 1))


def test_a_config_larger_than_any_real_one_is_refused_before_parsing(tmp_path: Path) -> None:
    # 17 MiB of layer types: a parse of documents up to the trace reader's 1 GiB limit
    # would take tens of GiB of Python objects; a config over 16 MiB is refused unread.
    kinds = ["full_attention"] * ((17 << 20) // len('"full_attention", '))
    cfg = write(tmp_path, "config.json", json.dumps({**TINY, "num_hidden_layers": len(kinds), "layer_types": kinds}))
    assert os.path.getsize(cfg) > 16 << 20
    r = run_cli("ledger", "--hf-config", cfg)
    assert_clean(r, "17 MiB config")
    assert r.returncode == 2 and "larger than 16,777,216 bytes" in r.stderr, r.stderr
