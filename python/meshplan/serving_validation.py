"""The serving cost model held against published, measured serving runs
(``validation/serving.json``, docs/serving.md): each case's exact deployment is evaluated with
:func:`meshplan.evaluate_serving` and its TTFT, TPOT and output throughput compared with what was
measured, where the source publishes them; errors are summarised overall, by GPU and by model
kind. A case may also measure ``e2e_s`` (a fixed batch's end-to-end latency, as vLLM's latency
benchmark reports), compared with the prediction's ``TTFT + (output_len - 1) * TPOT``.

A case with a ``concurrency`` is a closed-loop run with that many requests in flight; a case with
a ``request_rate`` and no concurrency an open-loop run (Poisson arrivals at that rate). The
traffic's ``arrival`` (``spread``, ``waves``, ``poisson``) and ``num_requests`` (the benchmark's
number of prompts) are the load parameters of the queue model (docs/serving.md §5.1), taken from
the source's benchmark command.

A case may name the constants of ``data/serving.toml`` that were fitted on it
(``in_sample_for``, e.g. ``["moe_block_fp8_gemm_efficiency"]``): it is in sample for them, and the
summary's ``out_of_sample`` block (overall and by GPU) leaves such cases out; that block is the
figure to quote.

A case without a concurrency is an offline maximum-load run: the engine batches as many
sequences as its KV cache holds, up to its ``max_batch_size`` (the file's ``engines`` table says
which, with its source), so the prediction evaluates that batch. A batch is a multiple of the
plan's attention-DP ranks; with fewer requests in flight than ranks, the evaluation runs the
requests there are (the core holds a worker to its share of the concurrency).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _core
from .errors import InvalidCaseError, InvalidInputError
from .hardware import Cluster
from .model import Model
from .serving import _NAMED_WORKER_KEYS, _complete, serving_problem

METRICS = ("output_tokens_per_s", "ttft_s", "tpot_s", "e2e_s")
"""What a case may measure, each compared where the source publishes it."""


def is_serving_file(text: str) -> bool:
    """Whether ``text`` is a serving case file (a JSON object with ``"kind": "serving"``)."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("kind") == "serving"


@dataclass
class ServingValidationReport:
    """Per-case rows (``id``, ``gpu``, ``model``, ``engine``, ``arch``, predicted and measured values
    and their absolute percentage errors) and the summary (``n``, ``median_ape``, ``p90_ape`` per
    metric, overall, ``by_gpu``, ``by_arch`` and ``by_engine``, and ``out_of_sample``: overall and by
    GPU over the cases no constant was fitted on)."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "summary": self.summary}


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in METRICS:
        apes = [r["ape"][metric] for r in rows if r["ape"].get(metric) is not None]
        out[metric] = {"n": len(apes), "median_ape": _core.percentile(apes, 0.5), "p90_ape": _core.percentile(apes, 0.9)}
    return out


def _by(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The summary of each group of ``rows`` by ``key`` (``gpu``, ``arch``, ``engine``), in order."""
    return {group: _stats([r for r in rows if r[key] == group]) for group in sorted({r[key] for r in rows})}


def _copy_worker_fields(src: dict[str, Any], dst: dict[str, Any], integers: tuple[str, ...]) -> None:
    """Copies into the worker ``dst`` the ``integers`` fields and the named ones that ``src``, a
    case's plan or prefill pool, sets."""
    for key in integers:
        if src.get(key) is not None:
            dst[key] = int(src[key])
    for key in _NAMED_WORKER_KEYS:
        if src.get(key) is not None:
            dst[key] = src[key]


def _case(case: dict[str, Any], engines: dict[str, Any], index: int) -> dict[str, Any]:
    try:
        model = Model.preset(case["model"])
        cluster = Cluster(case["gpu"], int(case["num_gpus"]))
        traffic, plan, measured = case["traffic"], case["plan"], case["measured"]
        engine = engines.get(case.get("engine", ""), {})
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidCaseError(f"serving case {index} ({case.get('id', '?')}): missing or bad {e}") from None
    problem = serving_problem(
        model, cluster, input_len=traffic.get("input_len"), output_len=traffic.get("output_len"),
        lengths=traffic.get("lengths"),
        weight_precision=case.get("weight_precision", "bf16"), kv_precision=case.get("kv_precision", "bf16"),
        weight_scaling=case.get("weight_scaling"),
        expert_weights=case.get("expert_weights"),
        prefix_fraction=traffic.get("prefix_fraction", 0.0),
        cached_fraction=traffic.get("cached_fraction", 0.0), concurrency=traffic.get("concurrency"),
        request_rate=traffic.get("request_rate"), arrival=traffic.get("arrival"),
        num_requests=traffic.get("num_requests"),
    )
    adp = int(plan.get("attention_dp", 1))
    stage = int(plan["tp"]) * adp
    ep = int(plan.get("ep", 1))
    worker = {"tp": plan["tp"], "pp": plan.get("pp", 1), "attention_dp": adp, "ep": ep,
              "expert_tp": plan.get("expert_tp", stage // ep), "max_sequences": adp}
    _copy_worker_fields(plan, worker, ("max_batched_tokens", "kv_tokens", "output_lag_steps"))
    deployment: dict[str, Any] = {"worker": worker, "replicas": plan.get("replicas", 1)}
    if plan.get("prefill") is not None:
        # A disaggregated deployment: its prefill workers as the case states them, their batch
        # (the prompts one prefill forward takes) included.
        pre = plan["prefill"]
        try:
            prefill = {"tp": int(pre["tp"]), "max_sequences": int(pre["max_sequences"])}
            _copy_worker_fields(pre, prefill, ("pp", "attention_dp", "ep", "expert_tp", "max_batched_tokens",
                                               "kv_tokens"))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidCaseError(
                f"serving case {index} ({case.get('id', '?')}): plan.prefill: missing or bad {e}") from None
        # expert_tp as a plan string defaults it (the core checks what is left).
        deployment["prefill"] = _complete(prefill)
        deployment["prefill_replicas"] = int(plan.get("prefill_replicas", 1))
    fitted = case.get("in_sample_for", [])
    if not isinstance(fitted, list) or not all(isinstance(n, str) and n for n in fitted):
        raise InvalidCaseError(f"serving case {index} ({case.get('id', '?')}): in_sample_for = {fitted!r}; "
                               "expected a list of the names of the constants fitted on it")
    probe = _core.evaluate_serving(problem, deployment)
    fit = int(probe["memory"]["max_sequences_fit"])
    cap = int(engine.get("max_batch_size", fit)) * int(plan.get("replicas", 1))
    concurrency = traffic.get("concurrency")
    batch = min(fit, cap if concurrency is None else int(concurrency))
    batch = max(adp, batch // adp * adp)
    worker["max_sequences"] = batch
    ev = _core.evaluate_serving(problem, deployment)
    predicted = {"output_tokens_per_s": ev["output_tokens_per_s"], "ttft_s": ev["time"]["ttft_s"],
                 "tpot_s": ev["time"]["tpot_s"], "e2e_s": ev["time"]["e2e_s"]}
    ape = {}
    for metric in METRICS:
        m = measured.get(metric)
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise InvalidCaseError(
                f"serving case {index} ({case.get('id', '?')}): measured.{metric} = {m!r}; "
                "expected a positive number or null")
        ape[metric] = None if m is None else abs(predicted[metric] - m) / m
    return {
        "id": case.get("id"), "gpu": case["gpu"], "model": case["model"], "engine": str(case.get("engine", "-")),
        "arch": "moe" if model.moe is not None else "dense",
        # an open loop runs what its rate keeps in flight (the evaluation's own batch)
        "batch": round(ev["sequences_per_worker"] * int(plan.get("replicas", 1))) if traffic.get("arrival") == "poisson"
        else batch, "kv_capacity_sequences": fit, "feasible": ev["feasible"],
        "predicted": predicted, "measured": {k: measured.get(k) for k in METRICS}, "ape": ape,
        "in_sample_for": fitted,
    }


def _named_case(case: Any, engines: dict[str, Any], index: int) -> dict[str, Any]:
    """:func:`_case`, its field errors (the core's, naming the field) naming the case too."""
    try:
        return _case(case, engines, index)
    except InvalidCaseError:
        raise
    except InvalidInputError as e:
        name = case.get("id", "?") if isinstance(case, dict) else "?"
        raise InvalidCaseError(f"serving case {index} ({name}): {e}") from None


def validate_serving(text: str) -> ServingValidationReport:
    """Evaluates every case of a serving case file (its JSON ``text``)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("kind") != "serving" or not isinstance(data.get("cases"), list):
        raise InvalidCaseError("serving case file: expected {\"kind\": \"serving\", \"cases\": [...]}")
    engines = data.get("engines", {})
    rows = [_named_case(c, engines, i) for i, c in enumerate(data["cases"])]
    # The figure to quote: the cases no constant was fitted on.
    held_out = [r for r in rows if not r["in_sample_for"]]
    summary: dict[str, Any] = {
        "all": _stats(rows), "by_gpu": _by(rows, "gpu"), "by_arch": _by(rows, "arch"),
        "by_engine": _by(rows, "engine"),
        "out_of_sample": {"cases": len(held_out), "all": _stats(held_out), "by_gpu": _by(held_out, "gpu")},
    }
    return ServingValidationReport(rows, summary)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


_UNITS = {"output_tokens_per_s": ("tok/s", 1.0, ".0f"), "ttft_s": ("ms", 1e3, ".1f"),
          "tpot_s": ("ms", 1e3, ".2f"), "e2e_s": ("ms", 1e3, ".0f")}
_TITLES = {"output_tokens_per_s": "throughput", "ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "e2e latency"}


def report_text(report: ServingValidationReport, worst: int = 10) -> str:
    """The summary by GPU and model kind (median and p90 error per metric), then the largest
    errors of each metric."""
    from .cli._render import table

    short = {"output_tokens_per_s": "thr", "ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "e2e"}
    header = ["group"]
    for metric in METRICS:
        header += [f"n {short[metric]}", f"{short[metric]} median", f"{short[metric]} p90"]

    def line(name: str, s: dict[str, Any]) -> list[Any]:
        row: list[Any] = [name]
        for metric in METRICS:
            row += [s[metric]["n"], _pct(s[metric]["median_ape"]), _pct(s[metric]["p90_ape"])]
        return row

    body = [line("all", report.summary["all"])]
    body += [line(f"gpu {g}", s) for g, s in report.summary["by_gpu"].items()]
    body += [line(f"arch {a}", s) for a, s in report.summary["by_arch"].items()]
    body += [line(f"engine {e}", s) for e, s in report.summary["by_engine"].items()]
    held = report.summary["out_of_sample"]
    outside = [line("all", held["all"])] + [line(f"gpu {g}", s) for g, s in held["by_gpu"].items()]
    fitted = sorted({n for r in report.rows for n in r["in_sample_for"]})
    lines = [f"{len(report.rows)} serving cases; absolute percentage error of the prediction", "",
             table(header, body), "",
             f"out of sample: the {held['cases']} cases no constant was fitted on"
             + (f" (the others are in sample for {', '.join(fitted)})" if fitted else ""),
             table(header, outside)]
    for metric in METRICS:
        scored = [r for r in report.rows if r["ape"][metric] is not None]
        if not scored:
            continue
        scored.sort(key=lambda r: -r["ape"][metric])
        unit, scale, fmt = _UNITS[metric]
        lines += ["", f"largest {_TITLES[metric]} errors (of {len(scored)}):", table(
            ["case", "batch", f"predicted {unit}", f"measured {unit}", "APE"],
            [[r["id"], r["batch"], format(r["predicted"][metric] * scale, fmt),
              format(r["measured"][metric] * scale, fmt), _pct(r["ape"][metric])] for r in scored[:worst]],
        )]
    return "\n".join(lines) + "\n"
