"""The compiled core (Rust, PyO3). Plain data in, plain data out.

Every function converts its arguments to Rust values (a dict that does not fit raises
``InvalidInputError`` naming the field path, e.g. ``model.moe.top_k``), releases the GIL, calls
the core, and maps its errors onto ``meshplan.errors``. Use the typed API of ``meshplan``
instead unless you hold the dicts already.

Every integer input has documented bounds (:func:`limits`, ``docs/limits.md``): a value outside
them — or one that is no integer of the field's type at all (negative, 2**64, a float, a
string) — raises ``InvalidInputError("invalid {field}: {value} (allowed: {lo}..={hi})")``, the
value an ``int`` in decimal, anything else its ``repr()``, cut to 64 characters and ``…``. The
exception's ``field``, ``value`` and ``allowed`` attributes hold the three parts.
"""

from typing import Any, Callable, Mapping, Optional, Sequence, final

__all__ = [
    "__version__",
    "MAX_LENGTH_CLASSES",
    "CancelToken",
    "model_presets",
    "model_preset",
    "model_aliases",
    "gpu_presets",
    "gpu_preset",
    "gpu_provenance",
    "matmul_realisation",
    "stacks",
    "model_from_hf_config",
    "default_space",
    "evaluate",
    "search",
    "validate",
    "summarise",
    "percentile",
    "apply_calibration",
    "collective_times",
    "gemm_times",
    "attention_length_factors",
    "rank_layer_counts",
    "explain",
    "decode_traffic",
    "rank_orders",
    "feasible_space",
    "search_many",
    "limits",
    "search_serving",
    "evaluate_serving",
    "explain_serving",
    "serving_lengths",
]

__version__: str
#: Most classes of a serving problem's length distribution (``traffic.lengths``).
MAX_LENGTH_CLASSES: int

@final
class CancelToken:
    """A flag that stops a running search from another thread.

    Pass it as ``search(..., cancel=token)`` and call ``token.cancel()``; the search then raises
    ``CancelledError``. A token stays cancelled once cancelled.
    """

    def __new__(cls) -> CancelToken: ...
    def cancel(self) -> None:
        """Asks every search holding this token to stop."""
    @property
    def cancelled(self) -> bool:
        """Whether ``cancel()`` was called."""

def model_presets() -> list[str]:
    """Names of the built-in model presets, sorted."""

def model_preset(name: str) -> dict[str, Any]:
    """The model preset ``name`` (core ``Model`` shape); ``UnknownPresetError`` otherwise."""

def model_aliases() -> list[dict[str, str]]:
    """The model aliases (``name``, ``preset``, ``why``), sorted by name."""

def gpu_presets() -> list[str]:
    """Names of the built-in GPU presets, sorted."""

def stacks() -> list[dict[str, Any]]:
    """Every training stack profile (core ``Stack`` shape), sorted by name."""

def gpu_preset(name: str) -> dict[str, Any]:
    """The GPU preset ``name`` (core ``Gpu`` shape); ``UnknownPresetError`` otherwise."""

def matmul_realisation(architecture: Optional[str] = None) -> tuple[str, float]:
    """The class of ``data/device.toml`` ``matmul_realisation`` a GPU of ``architecture`` (None:
    unknown) belongs to, and that class's realisation: ``(class, realisation)``."""
    ...

def gpu_provenance(name: str) -> dict[str, Any]:
    """Where each calibration constant of the GPU preset ``name`` comes from: ``{"summary":
    kind, "constants": {constant: {"kind": kind, "note": str}}}``, kind one of ``fitted``,
    ``measured``, ``derived``, ``shared``, ``assumed``."""

def model_from_hf_config(json_text: str, name: Optional[str] = None) -> dict[str, Any]:
    """A model dict from the text of a Hugging Face ``config.json``; ``HfConfigError`` when it
    cannot be parsed or mapped. ``name`` overrides the name taken from the file."""

def default_space() -> dict[str, Any]:
    """The default search space (core ``SearchSpace`` shape, every field present)."""

def evaluate(
    problem: dict[str, Any],
    plan: dict[str, Any],
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Scores one plan on ``problem`` = ``{"model", "cluster", "workload"}`` (full dicts).

    Returns the core ``Evaluation`` shape; an infeasible plan has ``feasible`` False and its
    ``reasons``. A malformed plan (zero degree, product not the GPU count) raises
    ``InvalidInputError``. ``timeout_s`` and ``cancel`` as :func:`search` (the work is bounded by
    the plan's structure, so they only matter for a server's deadline or a caller's cancel).
    """

def search(
    problem: dict[str, Any],
    space: Optional[dict[str, Any]] = None,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Ranked plans of ``problem`` in ``space`` (None: the default space).

    Returns ``{"plans": [Evaluation...], "stats": {...}}``. ``threads`` None uses
    ``MESHPLAN_THREADS``, else every core. ``timeout_s`` raises ``DeadlineExceededError`` when it
    passes, ``cancel`` raises ``CancelledError`` once cancelled; Ctrl-C stops the search and
    raises ``KeyboardInterrupt``.
    """

def validate(
    cases_json: str,
    search: bool = False,
    calibration: Optional[str] = None,
    threads: Optional[int] = None,
) -> dict[str, Any]:
    """Validates the cost model against published runs.

    ``cases_json`` is the text of a case file (schema: validation/README.md), ``calibration`` the text
    of a calibration-overrides file (TOML or JSON). Returns ``{"cases": [...], "summary": {...}}``;
    a case that does not fit the schema raises ``InvalidCaseError``.
    """

def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-quantile of ``values``, interpolated as NumPy does; None for no values."""

def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary (``throughput``, ``memory``, ``by_gpu``, ``by_arch``) of case rows as
    :func:`validate` returns them (extra keys ignored), computed as ``validate`` computes its own."""

def apply_calibration(gpu: dict[str, Any], calibration: str) -> dict[str, Any]:
    """``gpu`` (core ``Gpu`` shape) with the overrides of ``calibration`` (TOML or JSON text,
    tables keyed by GPU preset name or ``"*"``) applied and re-validated."""

def collective_times(gpu: dict[str, Any], queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each query ``{kind, bytes, group_size, per_domain}`` priced on ``gpu``'s calibrated
    fabrics as the planner prices it: ``{total_s, latency_s, bandwidth_s, algorithm,
    protocol}``."""

def attention_length_factors(seqs: list[float]) -> list[float]:
    """Flash attention's rate at each kernel call length relative to the reference length at
    which ``attention_efficiency`` holds (docs/costmodel.md §5.2)."""

def rank_layer_counts(layers: int, plan: dict[str, Any]) -> list[tuple[int, int]]:
    """Layers per pipeline rank of ``plan`` on a model of ``layers`` layers, as ``(ranks, layers
    each)`` runs in rank order: the split the cost model times (``stages.rs``)."""

def gemm_times(gpu: dict[str, Any], precision: str, shapes: list[list[float]]) -> list[float]:
    """Seconds of each ``[m, n, k]`` GEMM on ``gpu`` at ``precision`` as the time model charges
    it."""

def explain(
    problem: dict[str, Any],
    plan: dict[str, Any],
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Explains one plan on ``problem`` axis by axis (core ``Explanation`` shape).

    Returns ``{"plan", "evaluation", "mesh", "axes", "pipeline"}``: for every axis present
    (dp, tp, pp, ep, cp, zero) what is sharded, its collectives (count per step, message bytes,
    bytes per token and per step per GPU, seconds, latency-bound), its fabric and group, and its
    exposed and overlapped seconds. A mesh group's ``example_ranks`` are the first 64 ranks of
    rank 0's group (its ``size`` says how many there are); ``pipeline["stages"]`` lists the first
    1,024 pipeline ranks (the plan's ``pp`` says how many there are). Errors, ``timeout_s`` and
    ``cancel`` as :func:`evaluate`.
    """

def decode_traffic(
    model: dict[str, Any], cluster: dict[str, Any], tp: int, tokens_per_s: float
) -> dict[str, Any]:
    """Tensor-parallel all-reduce traffic of batch-1 decoding with ``tp`` GPUs at
    ``tokens_per_s`` (docs/costmodel.md §7(a)): bytes per token per GPU, GB/s, the fraction of the
    scale-up link, and whether the all-reduces are latency-bound."""

def search_serving(
    problem: dict[str, Any],
    space: Optional[dict[str, Any]] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Searches the serving deployments of a serving problem ``{"model", "cluster",
    "weight_precision", "kv_precision", "traffic", "slo", "objective"}`` (docs/serving.md).
    Returns ``{"plans", "pareto", "stats"}``: the deployments meeting the SLOs best first, the
    Pareto front of tokens/s per GPU against tokens/s per user, and the search statistics."""

def evaluate_serving(
    problem: dict[str, Any],
    plan: dict[str, Any],
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Scores one serving deployment ``{"worker", "replicas", "prefill", "prefill_replicas"}``:
    memory per GPU, TTFT, TPOT, throughput, and the violations of an infeasible one."""

def explain_serving(
    problem: dict[str, Any],
    plan: dict[str, Any],
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Explains one serving deployment axis by axis: ``{"evaluation", "axes",
    "ridge_flops_per_byte"}``."""

def serving_lengths(problem: dict[str, Any]) -> dict[str, Any]:
    """The lengths a serving problem's evaluation reads, the problem checked first:
    ``{"classes": [[share, input_len, output_len], ...], "mean_input", "mean_output",
    "decode_context", "full_context", "longest", "prefill_input", "mean_new", "median_class"}``."""

def rank_orders() -> list[str]:
    """Every rank order (the 120 permutations of tp, cp, ep, dp, pp), the default first."""

def feasible_space(
    problem: dict[str, Any],
    space: Optional[dict[str, Any]] = None,
    max_plans: Optional[int] = None,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> dict[str, Any]:
    """Every feasible plan of ``problem`` in ``space``, ranked best first, as column buffers.

    Returns ``{"columns": [(name, dtype, data)...], "categories": [(column, [label...])...],
    "stats": {...}}``: ``data`` is ``bytes`` in native byte order for ``numpy.frombuffer`` with
    ``dtype`` (``u1``, ``u4``, ``f8`` or ``?``). More than ``max_plans`` (default 5,000,000,
    at most 2**25) feasible plans raises ``TooManyPlansError`` (a ``SpaceTooLargeError``); the
    other arguments as :func:`search`.
    """

def search_many(
    queries: list[tuple[dict[str, Any], Optional[dict[str, Any]]]],
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
    progress: Optional[Callable[[int, int], object]] = None,
) -> list[dict[str, Any]]:
    """Searches every ``(problem, space)`` query in parallel on one pool (GIL released).

    Returns one entry per query, in order: ``{"ok": result}`` (the :func:`search` shape) or
    ``{"error": {"class": name in meshplan.errors, "message": str, "field", "value",
    "allowed"}}`` (the exception's typed context, each None where not applicable) for a query
    that failed on its own. ``progress(done, total)`` is called every 50 ms while the batch runs; an
    exception from it, like Ctrl-C, stops the batch and is raised.
    """

def limits() -> dict[str, tuple[int, int]]:
    """Every integer input's inclusive bounds by field path, e.g.
    ``{"cluster.num_gpus": (1, 1048576), "plan.pp": (1, 1048576), ...}``: the core's one table
    (``meshplan_core::limits::TABLE``, listed in ``docs/limits.md``).

    Paths are those of the errors: ``model.*``, ``cluster.*``, ``gpu.*`` (a GPU however it is
    nested), ``workload.*``, ``plan.*``, ``space.<degree>.fixed/min/max``, ``space.zero`` (each
    element), ``space.top_k``, ``space.max_candidates``, and the arguments ``max_plans``,
    ``threads`` and ``tp`` (of :func:`decode_traffic`). A value outside its bounds raises
    ``InvalidInputError("invalid {field}: {value} (allowed: {lo}..={hi})")``.
    """
