"""``meshplan.explain``: a plan taken apart axis by axis (core ``explain.rs``).

For every parallel axis a plan uses (dp, tp, pp, ep, cp, and ZeRO) the explanation gives the four
facts a learner should know by heart: what state is sharded, which collectives run (how often and
how big), how many bytes cross the wire per token and per step per GPU, and which fabric carries
them (NVLink inside a domain, the network across) — plus how much of that time the step exposes.
Every number is the cost model's own: bytes of the time model's messages, seconds of its fabric
model, exposed seconds of the evaluation's breakdown.

>>> x = meshplan.explain("llama3-70b", meshplan.Cluster("h100-sxm", 64),
...                      meshplan.Workload(128, 8192), "dp=2,tp=8,pp=4")  # doctest: +SKIP
>>> x.axis("tp")["collectives"][0]["bytes_per_token_per_gpu"]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Union

from . import _core
from ._core import CancelToken
from ._fields import as_type
from .api import ModelLike, as_model, problem_dict
from .errors import InvalidInputError
from .hardware import Cluster
from .plan import Plan
from .report import Evaluation
from .workload import Workload

AXES = ("dp", "tp", "pp", "ep", "cp", "zero")
"""Axis names of :attr:`Explanation.axes`, in the order the core lists them."""


class Explanation(Mapping[str, Any]):
    """A plan explained: a read-only mapping in the core's shape.

    Keys: ``plan``, ``evaluation``, ``mesh`` (rank ``order``, ``domain_size``, ``axes`` with
    their strides, ``groups`` with where each lands), ``axes`` (one dict per axis present:
    ``axis, degree, state_sharded, collectives, fabric, group_size, members_per_domain,
    domains, exposed_s, overlapped_s, notes``) and ``pipeline`` (per-stage, per-micro-batch
    forward/backward seconds); with Megatron recompute modules in the plan also
    ``recompute_modules`` (one dict per module: ``module, what, layers,
    saved_gib_per_micro_batch, backward_s_per_micro_batch`` on the worst rank); with activation
    offloading ``offload`` (``layers, host_gbps, layer_gib, copy_s_per_layer, window_layers,
    saved_gib_per_micro_batch, exposed_fwd_s_per_micro_batch, exposed_bwd_s_per_micro_batch``
    on the worst rank). :attr:`plan` and
    :attr:`evaluation` give the typed objects.
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidInputError(
                f"invalid explanation: expected a mapping, got {type(data).__name__}"
            )
        for key in ("plan", "evaluation", "mesh", "axes", "pipeline"):
            if key not in data:
                raise InvalidInputError(f"missing explanation.{key} (a required field)")
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        names = ", ".join(a["axis"] for a in self.axes)
        return f"Explanation({self.plan}, axes=[{names}])"

    @property
    def plan(self) -> Plan:
        """The plan, with its schedule resolved."""
        return Plan.from_dict(self._data["plan"])

    @property
    def evaluation(self) -> Evaluation:
        """The plan's evaluation (feasibility, memory and time breakdowns)."""
        return Evaluation.from_dict(self._data["evaluation"])

    @property
    def mesh(self) -> dict[str, Any]:
        mesh: dict[str, Any] = self._data["mesh"]
        return mesh

    @property
    def axes(self) -> list[dict[str, Any]]:
        axes: list[dict[str, Any]] = self._data["axes"]
        return axes

    @property
    def pipeline(self) -> dict[str, Any]:
        pipeline: dict[str, Any] = self._data["pipeline"]
        return pipeline

    def axis(self, name: str) -> dict[str, Any]:
        """The entry of axis ``name`` (``dp``, ``tp``, ``pp``, ``ep``, ``cp`` or ``zero``)."""
        for a in self.axes:
            if a["axis"] == name:
                return a
        present = ", ".join(a["axis"] for a in self.axes) or "none"
        raise KeyError(f"axis {name!r} is not used by this plan (present: {present})")

    def to_dict(self) -> dict[str, Any]:
        """The core's shape, as plain data (what ``--json`` prints)."""
        return dict(self._data)

    def _repr_html_(self) -> str:
        """Jupyter: the plan and explain's numbers per axis as HTML."""
        from .report_html import explanation_html

        return explanation_html(self)

    def to_text(self) -> str:
        """The human rendering the CLI prints."""
        return format_explanation(self)


def explain(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    plan: Union[Plan, str],
    *,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> Explanation:
    """Explains ``plan`` (a :class:`Plan` or ``"dp=8,tp=8,pp=4,..."``) axis by axis.

    An infeasible plan is explained too (``evaluation.feasible`` is False with its reasons); a
    malformed one raises :class:`~meshplan.errors.InvalidInputError`, as :func:`evaluate`.
    ``timeout_s`` and ``cancel`` as :func:`~meshplan.search`.
    """
    if isinstance(plan, str):
        plan = Plan.parse(plan)
    problem = problem_dict(model, cluster, workload)
    raw = _core.explain(problem, as_type(Plan, plan, "plan").to_dict(), timeout_s, cancel)
    return Explanation(raw)


def decode_traffic(
    model: ModelLike, cluster: Cluster, tp: int, tokens_per_s: float = 50.0
) -> dict[str, Any]:
    """Tensor-parallel all-reduce traffic of decoding one token at a time (docs/costmodel.md §7(a)).

    Returns ``all_reduces_per_token`` (two per layer), ``message_bytes`` (one token's hidden
    state), ``bytes_per_token_per_gpu``, ``gb_per_s_per_gpu`` at ``tokens_per_s``, the GPU's
    per-direction scale-up ``link_gb_per_s`` and ``fraction_of_link``, the latency and bandwidth
    seconds per token and ``latency_bound``.
    """
    cluster_dict = as_type(Cluster, cluster, "cluster").to_dict()
    raw: dict[str, Any] = _core.decode_traffic(
        as_model(model).to_dict(), cluster_dict, tp, tokens_per_s
    )
    return raw


# --- rendering ---------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """Decimal units (GB = 1e9 bytes, as docs/costmodel.md); exact below a megabyte."""
    if n < 1e6:
        return f"{n:,.0f} B"
    if n < 1e9:
        return f"{n / 1e6:,.2f} MB"
    return f"{n / 1e9:,.2f} GB"


def format_seconds(s: float) -> str:
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{s * 1e6:,.1f} µs"
    if s < 1:
        return f"{s * 1e3:,.2f} ms"
    return f"{s:,.3f} s"


_FABRIC = {
    "nvlink": "NVLink (inside one domain)",
    "network": "network (one member per domain)",
    "nvlink+network": "NVLink inside each domain, then the network",
}


def format_explanation(x: Explanation) -> str:
    """The plan, its mesh, then per axis: sharding, fabric, collectives with bytes, time."""
    ev = x.evaluation
    mesh = x.mesh
    lines = [
        f"plan        {ev.plan}  (rank order {mesh['order']}, innermost first)",
        f"feasible    {'yes' if ev.feasible else 'NO'}",
    ]
    lines += [f"  - {r.rule}: {r.message}" for r in ev.reasons]
    lines += [
        f"step time   {ev.step_time_s:.3f} s  ({ev.micro_batches} micro-batches per pipeline), "
        f"{ev.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * ev.mfu:.1f} %",
        f"memory      {ev.peak_memory_gib:.1f} GiB per GPU: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ev.memory_gib.items()),
        "time        " + ", ".join(f"{k} {format_seconds(v)}" for k, v in ev.time_s.items()),
        "",
        f"mesh        {mesh['domain_size']} GPUs of this job per NVLink domain; "
        + "  ".join(f"{a['axis']}={a['size']} (stride {a['stride']})" for a in mesh["axes"]),
    ]
    expert_axes = mesh.get("expert_axes") or []
    if expert_axes:
        # A folded plan: the expert layers' own mesh over the same ranks.
        names = {"tp": "etp", "dp": "edp"}
        lines.append(
            "expert mesh " + "  ".join(
                f"{names.get(a['axis'], a['axis'])}={a['size']} (stride {a['stride']})"
                for a in expert_axes if a["axis"] != "cp"
            )
        )
    for g in mesh["groups"]:
        ranks = g["example_ranks"]
        shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
        where = "crosses domains" if g["crosses_domain"] else "inside one domain"
        lines.append(
            f"  {g['axis']:<10} {g['size']} ranks, {g['members_per_domain']} per domain over "
            f"{g['domains']} domain(s), {where}; rank 0's group: {shown}"
        )
    for a in x.axes:
        lines += ["", _axis_title(a)]
        lines.append(f"  sharded   {a['state_sharded']}")
        lines.append(
            f"  fabric    {_FABRIC.get(a['fabric'], a['fabric'])}: group of {a['group_size']}, "
            f"{a['members_per_domain']} per domain, {a['domains']} domain(s)"
        )
        lines.append(
            f"  time      {format_seconds(a['exposed_s'])} exposed per step, "
            f"{format_seconds(a['overlapped_s'])} overlapped"
        )
        for c in a["collectives"]:
            bound = "  latency-bound" if c["latency_bound"] else ""
            lines.append(
                f"  {c['op']:<14} {c['when']}: x{c['count_per_step']:,}/step of "
                f"{format_bytes(c['message_bytes'])}; sends {format_bytes(c['bytes_per_token_per_gpu'])}"
                f"/token, {format_bytes(c['bytes_per_step_per_gpu'])}/step per GPU, "
                f"{format_seconds(c['seconds_per_step'])}/step ({c['algorithm']}, "
                f"latency {format_seconds(c['latency_seconds_per_step'])}){bound}"
            )
        lines += [f"  note      {n}" for n in a["notes"]]
    lines += recompute_lines(x)
    lines += offload_lines(x)
    return "\n".join(lines)


def recompute_lines(x: Mapping[str, Any]) -> list[str]:
    """Megatron-Core's recompute modules of the plan (none without modules): per module on the
    worst rank, what it saves per in-flight micro-batch and adds to each backward."""
    modules = x.get("recompute_modules") or []
    if not modules:
        return []
    lines = ["", "recompute modules (worst rank, per micro-batch; each alone)"]
    for m in modules:
        lines.append(
            f"  {m['module']:<14} {m['layers']} layers: saves {m['saved_gib_per_micro_batch']:.2f} GiB, "
            f"replays {format_seconds(m['backward_s_per_micro_batch'])} in the backward; {m['what']}"
        )
    return lines


def offload_lines(x: Mapping[str, Any]) -> list[str]:
    """The plan's activation offloading on the worst rank (none without it): what it takes off
    the GPU per in-flight micro-batch and what the copies over the host link cost."""
    o = x.get("offload")
    if not o:
        return []
    return [
        "",
        "activation offloading (worst rank, per micro-batch)",
        f"  {o['layers']} layers per chunk to host memory: saves "
        f"{o['saved_gib_per_micro_batch']:.2f} GiB at the peak (one reloaded layer stays); "
        f"each layer {o['layer_gib']:.2f} GiB, "
        f"{format_seconds(o['copy_s_per_layer'])} per direction at {o['host_gbps']:g} GB/s, "
        f"overlapping {o['window_layers']} layers of compute; exposed "
        f"{format_seconds(o['exposed_fwd_s_per_micro_batch'])} forward, "
        f"{format_seconds(o['exposed_bwd_s_per_micro_batch'])} backward",
    ]


def _axis_title(a: Mapping[str, Any]) -> str:
    name = a["axis"]
    if name == "zero":
        return f"ZeRO-{a['degree']}"
    return f"{name.upper()} = {a['degree']}"


__all__ = [
    "Explanation",
    "explain",
    "decode_traffic",
    "format_explanation",
    "format_bytes",
    "format_seconds",
    "AXES",
]
