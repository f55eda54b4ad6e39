"""Test-wide set-up: 8 simulated CPU devices for the sharding tests (must precede importing jax)."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LAPACK calls (the delta-rule triangular solves) with multi-threaded OpenBLAS spin-wait on a busy
# CPU and run ~1000x slower; XLA's own thread pool is unaffected.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# One persistent XLA compilation cache for the whole session (seqmodels.compilation): every xdist worker,
# every test that trains or evaluates in-process, and every train.py / eval.py / export.py a test starts
# (they inherit SEQMODELS_COMPILATION_CACHE) read and write the same directory, so a program the suite built
# once (the tiny model's train step, say) is read back by every later test that builds it. It lives under
# the clone, so a clean clone (CI) starts cold; clear it with `rm -rf .cache/xla-tests` (to time the suite
# as CI does, for example). The user's own cache (~/.cache/seqmodels/xla) is never touched. Writing it is safe
# now that `_release_compiled_executables` keeps a worker under its memory-mapping limit (a worker past it
# once crashed inside LoadedExecutable.serialize, while writing an entry). Measured on 2 cores, idle, 2026-12-07:
# the fast tier took 362 s with a cold cache and 374 s with none: programs compiled in-process rarely repeat,
# while the train.py processes of one test that rebuild the same run read each other's programs back.
_TEST_COMPILATION_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache",
                                       "xla-tests")
os.environ["SEQMODELS_COMPILATION_CACHE"] = _TEST_COMPILATION_CACHE
# transformers copies an export's remote-code modules into this cache when loading it; one per test process,
# so two workers never write and import the same copies at once.
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf_modules_")  # not inherited: xdist workers each set theirs

import gc  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from seqmodels.compilation import use_compilation_cache  # noqa: E402

use_compilation_cache(_TEST_COMPILATION_CACHE)  # also the programs tests compile without an entry point

# A suite started in the background by a non-interactive shell (`pytest ... &`, `nohup`) inherits SIGINT and
# SIGQUIT ignored, and so would every run a test starts: the tests that interrupt a run (tests/reliability,
# test_cluster) would wait on a signal that never arrives, and leave the run behind. Here they are caught
# again; a caught signal is default in a child after exec, so the runs the tests start see them.
for _signum, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _handler)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """Drop every compiled executable after a test module once they hold a quarter of the mapping limit.

    An XLA CPU executable holds about three memory mappings of JIT code until jax's caches let it go, and an
    xdist worker runs hundreds of modules: past Linux's ``vm.max_map_count`` (65,530 by default) the next
    compile cannot map its code and the worker aborts or segfaults inside ``backend_compile_and_load``.
    Clearing only past a quarter keeps the executables that later modules reuse for as long as it is safe.
    """
    yield
    limit, mapped = _memory_mappings()
    if mapped <= limit // 4:
        return
    import jax

    jax.clear_caches()
    gc.collect()
    limit, mapped = _memory_mappings()
    if mapped > limit // 2:
        pytest.fail(f"{mapped} memory mappings are still held after this module's executables were released "
                    f"(vm.max_map_count is {limit}): something keeps compiled functions alive across modules")


def _memory_mappings() -> tuple[int, int]:
    """(vm.max_map_count, mappings this process holds); zero mappings where /proc does not say."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps") as f:
            return limit, sum(1 for _ in f)
    except OSError:
        return 1, 0


def write_corpus(directory, num_files: int = 24, seed: int = 0):
    """Small deterministic text documents (made-up Python-like lines) under ``directory``."""
    rng = random.Random(seed)
    words = ["def", "return", "value", "index", "for", "in", "range", "if", "else", "self", "data", "x", "y"]
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(num_files):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(rng.randint(3, 30))]
        (directory / f"doc_{i:03d}.txt").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def tiny_corpus(tmp_path):
    """A glob over a generated corpus of 24 small text files."""
    return str(write_corpus(tmp_path / "corpus") / "*.txt")


def snapshot(directory: Path) -> dict:
    """Every path under ``directory`` with its modification time: equal snapshots = nothing was written."""
    return {path.relative_to(directory): path.stat().st_mtime_ns for path in directory.rglob("*")}


@pytest.fixture(scope="session")
def tiny_trained_run(tmp_path_factory, worker_id):
    """``(run_dir, corpus_glob)``: the tiny run of ``tiny_overrides`` trained for 10 steps (checkpoints at steps 5
    and 10) once per test session, whichever xdist worker asks first, behind a file lock.

    Read-only for its readers: a test that changes the run (damages a checkpoint, resumes it, writes an
    ``eval.json`` into it) copies it first (``shutil.copytree``). At the end of the session each worker checks
    that no file of it changed, and fails naming the files that did."""
    from filelock import FileLock

    import train as train_entry
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    root = shared / "tiny_trained_run"
    with FileLock(str(root) + ".lock"):
        if not (root / "complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            corpus = str(write_corpus(root / "corpus") / "*.txt")
            assert train_entry.main(tiny_overrides(root / "run", corpus, train__steps=10)) == 0
            (root / "complete").touch()
    run_dir = root / "run"
    before = snapshot(run_dir)
    yield run_dir, str(root / "corpus" / "*.txt")
    after = snapshot(run_dir)
    changed = sorted(str(name) for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"a test changed the shared tiny_trained_run (copy it before changing it): {changed[:10]}"


def tiny_overrides(run_dir, corpus_glob, **extra):
    """Overrides of a model and run small enough to train in seconds on CPU."""
    values = {
        "model.d_model": 32, "model.num_heads": 2, "model.mixers": "[attention] * 2", "model.max_seq_len": 64,
        "data.source": "text_files", "data.path": corpus_glob, "data.seq_len": 32, "data.heldout_fraction": 0.2,
        "train.batch_size": 8, "train.steps": 20, "train.run_dir": str(run_dir),
        "optim.warmup_steps": 2, "log.every_steps": 1, "log.progress": "never", "log.tensorboard": True,
        "checkpoint.every_steps": 5, "checkpoint.async_save": False,
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


# Cases the fast tier had kept that took over 5 s (setup + call) in the whole-suite run of 2026-12-04 on 2 cores
# (`CI=true PYTEST_ADDOPTS=--durations=0 bash .ci/run`, load 3.2-4.0): marked slow here by node id, so that
# `pytest -m "not slow"` stays under 4 minutes (it took 514 s with them). The whole suite, as CI runs it, keeps them.
# 2026-12-05: nine more of 9-18 s (the fast tier took 347-391 s on a clean clone); the state-passing test keeps
# its linear_scan case in the fast tier in place of the delta rule's.
MEASURED_SLOW = frozenset({
    # 10-12 s each in a fast tier of 401 s (2026-12-05), each with a sibling case left in the fast tier
    "tests/pallas_kernels/test_atlas_memory.py::test_memory_norm_is_layer_norm_of_the_branch_with_gain_plus_residual_and_its_closed_form_gradient[True]",
    "tests/pallas_kernels/test_atlas_memory.py::test_running_window_sum_equals_the_banded_sum[6]",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_atlas_chunked_gives_the_recurrent_logits_and_parameter_gradients[linear_memory_norm]",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_atlas_chunked_gives_the_recurrent_logits_and_parameter_gradients[omeganet]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[12-0-gather-moved7]",
    "tests/benchmarks/test_recurrent_benchmarks.py::test_train_step_benchmark_runs_one_tiny_case_through_the_pallas_path",
    "tests/pallas_kernels/test_atlas_memory.py::test_a_row_split_at_a_chunk_boundary_continues_from_the_first_parts_state[linear-p1-c6-b4-k0-reference]",
    "tests/pallas_kernels/test_atlas_memory.py::test_bf16_newton_schulz_matches_the_reference_in_bf16[linear-p2-c2-b4-k5-update]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_granularity_chunked_form_matches_its_token_by_token_reference[linear-c2-b16-k5-update]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_granularity_chunked_form_matches_its_token_by_token_reference[linear-c6-b4-k5-gradient]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_granularity_decoding_from_the_state_equals_the_training_form[5]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_granularity_decoding_from_the_state_equals_the_training_form[8]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_granularity_with_chunk_size_one_keeps_the_token_rule_memory_and_differs_from_it_beyond",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunk_size_one_is_the_fully_online_rule",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunked_form_matches_sequential_reference_values_and_gradients[deep-p1-c1-b4-k0-clip]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunked_form_matches_sequential_reference_values_and_gradients[deep-p2-c3-b4-k5]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunked_form_matches_sequential_reference_values_and_gradients[deep-p2-c5-b2-k5-polar]",
    "tests/pallas_kernels/test_atlas_memory.py::test_chunked_form_matches_sequential_reference_values_and_gradients[linear-p2-c2-b4-k5-update]",
    "tests/pallas_kernels/test_atlas_memory.py::test_each_matrix_orthogonalised_at_its_shape_equals_the_padded_stacked_call[muon]",
    "tests/pallas_kernels/test_atlas_memory.py::test_packed_documents_share_no_state",
    "tests/pallas_kernels/test_atlas_memory.py::test_running_window_sum_equals_the_banded_sum[3]",
    "tests/pallas_kernels/test_linear_scan.py::test_a_decay_per_row_equals_the_decay_broadcast_over_the_last_axis[False]",
    "tests/pallas_kernels/test_linear_scan.py::test_a_decay_per_row_equals_the_decay_broadcast_over_the_last_axis[True]",
    "tests/pallas_kernels/test_momentum_scan.py::test_scalar_decay_chunked_form_matches_the_token_recurrence_with_carried_states",
    "tests/pallas_kernels/test_momentum_scan.py::test_without_momentum_the_chunked_forms_are_the_backbone_kernels",
    "tests/reliability/test_collapse_guard.py::test_collapsed_run_stops_with_status_1_and_keeps_healthy_checkpoints",
    "tests/reliability/test_resume_settings.py::test_allowed_longer_schedule_resumes_and_says_what_the_learning_rate_does",
    "tests/seqmodels/evaluation/test_ruler.py::test_the_suite_decodes_an_ahn_model_with_its_bounded_cache",
    "tests/seqmodels/evaluation/test_ruler.py::test_the_suite_runs_on_a_recurrent_hybrid_and_reports_every_cell",
    "tests/seqmodels/hf/torch/test_ahn_chunked.py::test_the_ahn_compressors_chunked_give_the_recurrent_logits_and_decode_on_from_a_chunked_prefill[gated_deltanet]",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_an_exported_model_gives_the_recurrent_logits_chunked_and_decodes_on_from_a_chunked_prefill[atlas]",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_an_exported_model_gives_the_recurrent_logits_chunked_and_decodes_on_from_a_chunked_prefill[atlas_mag]",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_an_exported_model_gives_the_recurrent_logits_chunked_and_decodes_on_from_a_chunked_prefill[mamba2]",
    "tests/seqmodels/layers/test_context.py::test_attention_by_ring_matches_one_device_on_packed_rows[balanced]",
    "tests/seqmodels/layers/test_context.py::test_attention_by_ring_matches_one_device_on_packed_rows[contiguous]",
    "tests/seqmodels/layers/test_context.py::test_context_parallel_mixers_match_one_device_on_packed_rows[attention]",
    "tests/seqmodels/layers/test_context.py::test_context_parallel_mixers_match_one_device_on_packed_rows[gated_deltanet]",
    "tests/seqmodels/layers/test_context.py::test_context_parallel_mixers_match_one_device_on_packed_rows[swa]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_by_ring_equals_the_whole_row_bidirectional_and_on_8_shards",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[12-2-ring-moved3]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[None-0-gather-moved0]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[None-0-ring-moved1]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[chunk_gla_per_head_decay]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[gated_delta_rule]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[chunk_gla_per_key_decay]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[delta_rule_without_decay]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[momentum_delta_rule]",
    "tests/seqmodels/layers/test_state_passing.py::test_state_passing_over_four_shards_equals_the_whole_sequence[momentum_scalar_decay]",
    "tests/seqmodels/models/test_ahn_training.py::test_the_ahn_cache_is_a_fixed_fraction_of_full_attention_and_flops_stay_flat",
    "tests/seqmodels/test_sharding.py::test_parameters_are_sharded_as_the_rules_table_says",
    "tests/seqmodels/training/test_loop.py::test_loss_falls_and_metrics_are_written",
    "tests/seqmodels/training/test_loop.py::test_nonfinite_loss_stops_the_run_and_keeps_the_last_good_checkpoint",
    "tests/test_entry_points.py::test_checkpoint_of_another_architecture_is_refused_and_left_untouched",
    "tests/test_entry_points.py::test_eval_reports_heldout_perplexity_and_loss_by_position",
    "tests/test_eval_ruler.py::test_eval_ruler_writes_scores_a_table_and_heatmaps_and_leaves_out_lengths_beyond_the_model",
    "tests/seqmodels/hf/torch/test_chunked_forms.py::test_atlas_chunked_gives_the_recurrent_logits_and_parameter_gradients[atlas]",
    "tests/pallas_kernels/test_momentum_scan.py::test_auto_and_pallas_run_the_chunked_form",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[12-2-gather-moved2]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[17-1-gather-moved5]",
    "tests/seqmodels/mixers/test_longhorn.py::test_muonssm_longhorn_with_zero_steps_and_zero_gamma_is_longhorn",
    "tests/seqmodels/layers/test_banded.py::test_bfloat16_rows_stay_bfloat16_and_match_the_masked_path",
    # 2026-12-07: 4.7-7.6 s each in a fast tier of 242-251 s (idle, cold cache), each with a sibling left in it
    "tests/seqmodels/layers/test_ring_attention.py::test_the_rings_saved_residuals_do_not_grow_with_the_number_of_shards[contiguous]",
    "tests/seqmodels/layers/test_context.py::test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs[4-3-gather-moved4]",
    "tests/seqmodels/layers/test_ring_attention.py::test_ring_in_query_tiles_equals_one_device[True-balanced]",
    "tests/seqmodels/mixers/test_recurrent_mixers.py::test_muonssm_with_zero_steps_and_zero_gamma_is_its_backbone[muonssm_mamba2-mamba2]",
    "tests/seqmodels/layers/test_ring_attention.py::test_ring_outputs_and_gradients_equal_one_device_on_packed_rows[True-balanced-2]",
    "tests/pallas_kernels/test_triton_lowering.py::test_atlas_memory_sweep_and_its_recompute_backward_lower_to_triton[45-90-True]",
    "tests/pallas_kernels/test_atlas_memory_fused.py::test_fused_kernel_matches_the_reference_at_other_chunk_sizes[1]",
    "tests/seqmodels/test_compilation.py::test_an_empty_setting_compiles_without_a_cache",
})


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by -m
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in MEASURED_SLOW:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # before the xdist worker sends its collection to the scheduler (same hook)
def pytest_collection_finish(session):
    """Carry every ``xdist_group`` mark into the node id the ``loadgroup`` scheduler reads (``<id>@<group>``).

    pytest-xdist 3.8 appends the group by assigning ``item._nodeid``, which pytest 9 no longer reads (an item's
    id is its ``_id``), so without this the groups were ignored: a module's shared fixture was built once per
    worker and the launch tests, meant to run one after another, ran on both workers at once. Runs before the
    worker reports its collection."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(groups)}")
