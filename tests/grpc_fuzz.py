"""A fuzzer for ``meshplan.v1.Planner`` that knows the service only through server reflection.

No generated ``_pb2`` code: :class:`Reflected` asks the server for its descriptors
(``ProtoReflectionDescriptorDatabase``), builds message classes from them
(``message_factory.GetMessageClass``), and :class:`Generator` makes requests by walking the
descriptors — so it tests what a client written in any language, from the server's own
description, can send. Shared by ``tests/test_server_fuzz.py`` (a bounded run in CI) and
``benchmarks/fuzz_grpc.py`` (long runs with many clients).

Requests come in five kinds, mixed at random (one seed, reproducible):

- ``plausible``: presets (learnt from ``ListPresets``), small clusters, plans whose degrees
  multiply to the GPU count, small spaces — most succeed;
- ``scale``: well-formed requests at the limits and past them: a GPU count of 2^10 … 2^32 - 1
  with one degree (or the batch) as large as it, the shape of issue 9's reproducers (a
  pipeline of 2^26 stages, a data-parallel degree of 2^32 - 1, ``cp`` of 2^31);
- ``edge``: a plausible request with one to three integer fields, anywhere in the message tree,
  set to a boundary value (0, 1, 2^16, 2^31, 2^32, 2^64 - 1, ...); :meth:`Generator.edge_sweep`
  lists every integer field at every boundary value once;
- ``strings``: a plausible request with a string field replaced (20,000 characters, unknown
  presets, control characters, paths);
- ``random``: every field drawn from the descriptor alone, nested messages included;
- ``malformed``: bytes that are not a valid request (random, truncated, bit-flipped, wrong wire
  types, lengths past the end).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE = "meshplan.v1.Planner"
HEALTH = "grpc.health.v1.Health"

INT64_EDGES = (0, 1, 2, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -1, -(2**63))
"""Boundary values of an ``int64`` field. ``-1`` is 2^64 - 1 on the wire (a varint of ten
bytes): what a client that sends an unsigned 64-bit maximum puts there."""
UINT_EDGES = (0, 1, 2, 2**16, 2**31, 2**32 - 1)
"""Boundary values of an unsigned field (``uint32``; ``uint64`` adds 2^32 and 2^64 - 1)."""
LONG_TEXT = 20_000
"""Characters of the long strings (an echoed value of this size overflows a status header)."""

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""What a Planner call may answer. INVALID_ARGUMENT: a bad field or bytes that are not a
request; RESOURCE_EXHAUSTED: a space beyond the server's cap, a response beyond its size cap, or
a full queue; DEADLINE_EXCEEDED: the client's deadline. Anything else (INTERNAL, UNKNOWN,
UNAVAILABLE, a timeout past the deadline) is a defect."""
ALLOWED_HEALTH = {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}
"""What a health Check may answer: NOT_FOUND is the health protocol's answer for a service name
the server does not know (the fuzzer sends random ones); INVALID_ARGUMENT for malformed bytes."""

INTERNALS = (
    "Traceback", "OverflowError", "TypeError", "AttributeError", "KeyError", "IndexError",
    "ZeroDivisionError", "RuntimeError", "panicked", "internal error",
)
"""Words that would mean Python or Rust internals leaked into a status message."""


class Reflected:
    """The message classes of a server's services, from its reflection only."""

    def __init__(self, channel: grpc.Channel):
        self.database = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.database)
        self.service = self.pool.FindServiceByName(SERVICE)
        self.methods: dict[str, MethodDescriptor] = {m.name: m for m in self.service.methods}
        self.health = self.pool.FindServiceByName(HEALTH)

    def request_class(self, method: MethodDescriptor) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(method.input_type)
        return cls

    def response_class(self, method: MethodDescriptor) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(method.output_type)
        return cls

    def message_class(self, descriptor: Descriptor) -> type[Message]:
        cls: type[Message] = message_factory.GetMessageClass(descriptor)
        return cls

    def rpc(self, channel: grpc.Channel, service: str, method: str) -> Any:
        """A raw (bytes in, bytes out) callable of ``/service/method``."""
        return channel.unary_unary(f"/{service}/{method}")


def presets(reflected: Reflected, channel: grpc.Channel) -> tuple[list[str], list[str]]:
    """Model and GPU preset names, asked of the server through ``ListPresets``."""
    method = reflected.methods["ListPresets"]
    raw = reflected.rpc(channel, SERVICE, "ListPresets")(b"", timeout=30)
    response = reflected.response_class(method).FromString(raw)
    models = [m.name for m in getattr(response, "models")]
    gpus = [g.name for g in getattr(response, "gpus")]
    return models, gpus


@dataclass
class Call:
    """One generated request."""

    service: str
    method: str
    kind: str
    body: bytes
    note: str = ""
    """What was done to it (the edge field and value, ...), for failure reports."""


def _is_repeated(f: FieldDescriptor) -> bool:
    flag = getattr(f, "is_repeated", None)
    if flag is None:
        return bool(f.label == FieldDescriptor.LABEL_REPEATED)
    return bool(flag() if callable(flag) else flag)


def _int_edges(f: FieldDescriptor) -> Sequence[int]:
    if f.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return (*UINT_EDGES, 2**32, 2**64 - 1)
    if f.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return UINT_EDGES
    if f.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32,
                  FieldDescriptor.TYPE_SFIXED32):
        return (0, 1, 2**16, 2**31 - 1, -1, -(2**31))
    return INT64_EDGES


INT_TYPES = {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
}
FLOAT_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def int_paths(descriptor: Descriptor, depth: int = 4) -> list[tuple[str, ...]]:
    """Every integer field reachable from ``descriptor``, as a path of field names (repeated
    integers included; a recursive message stops at ``depth``)."""
    out: list[tuple[str, ...]] = []
    for f in descriptor.fields:
        if f.type in INT_TYPES:
            out.append((f.name,))
        elif f.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(f) and depth > 0:
            out += [(f.name, *rest) for rest in int_paths(f.message_type, depth - 1)]
    return out


def string_paths(descriptor: Descriptor, depth: int = 4) -> list[tuple[str, ...]]:
    """Every string field reachable from ``descriptor`` (as :func:`int_paths`)."""
    out: list[tuple[str, ...]] = []
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            out.append((f.name,))
        elif f.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(f) and depth > 0:
            out += [(f.name, *rest) for rest in string_paths(f.message_type, depth - 1)]
    return out


def set_path(msg: Message, path: Sequence[str], value: Any) -> None:
    """Sets the field at ``path`` (creating the messages on the way; a repeated field gets
    ``value`` appended)."""
    for name in path[:-1]:
        msg = getattr(msg, name)
    f = msg.DESCRIPTOR.fields_by_name[path[-1]]
    if _is_repeated(f):
        getattr(msg, path[-1]).append(value)
    else:
        setattr(msg, path[-1], value)


class Generator:
    """Requests for the Planner's methods, from a seed."""

    def __init__(self, reflected: Reflected, models: Sequence[str], gpus: Sequence[str],
                 seed: int = 0):
        self.r = reflected
        self.rng = random.Random(seed)
        self.models = list(models)
        self.gpus = list(gpus)
        self.words = {
            "precision": ["bf16", "fp16", "fp8", "mxfp8", "nvfp4"],
            "optimizer": ["adam", "sgd-momentum"],
            "recompute": ["none", "selective", "full", "selective-op"],
            "schedules": ["1f1b", "interleaved-1f1b", "zb-h1"],
            "schedule": ["1f1b", "interleaved-1f1b", "zb-h1"],
            "orders": ["tp-cp-ep-dp-pp", "tp-dp-cp-ep-pp", "pp-dp-ep-cp-tp"],
            "order": ["tp-cp-ep-dp-pp", "tp-dp-cp-ep-pp", "pp-dp-ep-cp-tp"],
            "activation": ["swiglu", "gelu"],
            "norm": ["rmsnorm", "layernorm"],
        }

    # -- the mix ------------------------------------------------------------------------------

    KINDS = (("plausible", 35), ("scale", 10), ("edge", 22), ("strings", 8), ("random", 15),
             ("malformed", 8), ("health", 2))
    SCALES = (2**10, 2**16, 2**20, 2**20 + 1, 2**24, 2**26, 2**31, 2**32 - 1)
    """GPU counts of the ``scale`` requests: within the limits (2^20) and past them."""

    def calls(self, count: int) -> Iterator[Call]:
        """``count`` requests of every kind, mixed by :attr:`KINDS`' weights."""
        names = [k for k, _ in self.KINDS]
        weights = [w for _, w in self.KINDS]
        for _ in range(count):
            yield self.one(self.rng.choices(names, weights)[0])

    def one(self, kind: str) -> Call:
        method = self.rng.choice(["Search", "Evaluate", "Explain", "Evaluate", "Explain",
                                  "Search", "ListPresets"] if kind != "plausible"
                                 else ["Search", "Evaluate", "Explain"])
        if kind == "health":
            return self.health_call()
        if kind == "malformed":
            return self.malformed(method)
        if method == "ListPresets":
            return Call(SERVICE, method, kind, self.random_message(
                self.r.methods[method].input_type).SerializeToString())
        if kind == "plausible":
            return Call(SERVICE, method, kind, self.plausible(method).SerializeToString())
        if kind == "scale":
            msg, note = self.scaled(method)
            return Call(SERVICE, method, kind, msg.SerializeToString(), note)
        if kind == "edge":
            msg = self.plausible(method)
            paths = int_paths(msg.DESCRIPTOR)
            notes = []
            for path in self.rng.sample(paths, k=min(len(paths), self.rng.randint(1, 3))):
                f = self._field(msg.DESCRIPTOR, path)
                value = self.rng.choice(_int_edges(f))
                set_path(msg, path, value)
                notes.append(f"{'.'.join(path)}={value}")
            return Call(SERVICE, method, kind, msg.SerializeToString(), ", ".join(notes))
        if kind == "strings":
            msg = self.plausible(method)
            path = self.rng.choice(string_paths(msg.DESCRIPTOR))
            value = self.odd_string()
            set_path(msg, path, value)
            return Call(SERVICE, method, kind, msg.SerializeToString(),
                        f"{'.'.join(path)}={value[:20]!r}... ({len(value)} chars)")
        msg = self.random_message(self.r.methods[method].input_type)
        return Call(SERVICE, method, kind, msg.SerializeToString())

    def edge_sweep(self) -> Iterator[Call]:
        """Every integer field of every Planner request, at every boundary value of its type,
        in an otherwise plausible request: one call each."""
        for method in ("Search", "Evaluate", "Explain"):
            descriptor = self.r.methods[method].input_type
            for path in int_paths(descriptor):
                f = self._field(descriptor, path)
                for value in _int_edges(f):
                    msg = self.plausible(method)
                    set_path(msg, path, value)
                    yield Call(SERVICE, method, "edge", msg.SerializeToString(),
                               f"{'.'.join(path)}={value}")

    # -- kinds -------------------------------------------------------------------------------

    def plausible(self, method: str) -> Message:
        """A request a careful client would send: presets, a power-of-two cluster of at most 64
        GPUs, a plan whose degrees multiply to it, a small space."""
        rng = self.rng
        msg = self.r.request_class(self.r.methods[method])()
        n = rng.choice([1, 2, 4, 8, 16, 32, 64])
        model = getattr(msg, "model")
        if rng.random() < 0.8:
            model.preset = rng.choice(self.models)
        else:
            dims = model.dims
            heads = rng.choice([8, 16, 32])
            dims.name = "tiny"
            dims.layers = rng.choice([2, 4, 8, 32])
            dims.hidden = heads * 64
            dims.heads = heads
            dims.kv_heads = rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0])
            dims.ffn_hidden = heads * 64 * 4
            dims.vocab = 32000
            if rng.random() < 0.3:
                moe = dims.moe
                moe.num_experts = rng.choice([4, 8, 16])
                moe.top_k = 2
                moe.expert_ffn_hidden = heads * 64
        cluster = getattr(msg, "cluster")
        cluster.gpu = rng.choice(self.gpus)
        cluster.num_gpus = n
        workload = getattr(msg, "workload")
        workload.global_batch = rng.choice([8, 64, 256])
        workload.seq_len = rng.choice([1024, 4096, 8192])
        if rng.random() < 0.3:
            workload.precision = rng.choice(self.words["precision"])
        if method == "Search":
            space = getattr(msg, "space")
            space.tp.max = rng.choice([1, 2, 8])
            space.micro_batch.max = rng.choice([1, 2, 4])
            space.zero.extend(rng.sample([0, 1, 2, 3], k=rng.randint(1, 2)))
            space.recompute.extend(rng.sample(["none", "selective", "full"], k=rng.randint(1, 2)))
            space.top_k = rng.randint(1, 20)
        else:
            plan = getattr(msg, "plan")
            tp = rng.choice([d for d in (1, 2, 4, 8) if n % d == 0])
            pp = rng.choice([d for d in (1, 2, 4) if (n // tp) % d == 0])
            plan.dp, plan.tp, plan.pp = n // tp // pp, tp, pp
            plan.zero = rng.randint(0, 3)
            plan.recompute = rng.choice(["none", "selective", "full"])
            plan.micro_batch = rng.choice([1, 2, 4])
        return msg

    def scaled(self, method: str) -> tuple[Message, str]:
        """A plausible request on ``n`` GPUs, ``n`` from :attr:`SCALES`, with one degree of the
        plan (or of a fixed search space) equal to ``n`` and, at times, the global batch too."""
        rng = self.rng
        msg = self.plausible(method)
        n = rng.choice(self.SCALES)
        axis = rng.choice(["dp", "tp", "pp", "ep", "cp"])
        cluster = getattr(msg, "cluster")
        cluster.num_gpus = n
        if rng.random() < 0.3:
            cluster.nvlink_domain = rng.choice([8, 72, n])
        workload = getattr(msg, "workload")
        if rng.random() < 0.5:
            workload.global_batch = min(n, 2**32 - 1)
        if rng.random() < 0.3:
            workload.seq_len = rng.choice([2**16, 2**20, 2**24])
        if method == "Search":
            space = getattr(msg, "space")
            space.Clear()
            getattr(space, axis).fixed = n
            space.top_k = rng.choice([1, 10, 1000])
        else:
            plan = getattr(msg, "plan")
            for name in ("dp", "tp", "pp", "ep", "cp"):
                setattr(plan, name, n if name == axis else 1)
            if rng.random() < 0.3:
                plan.vpp = rng.choice([2, 2**16])
            if rng.random() < 0.3:
                plan.micro_batch = rng.choice([1, 2**16, n])
        return msg, f"num_gpus={n} {axis}={n} global_batch={workload.global_batch}"

    def odd_string(self) -> str:
        rng = self.rng
        return rng.choice([
            "x" * LONG_TEXT,
            "é" * LONG_TEXT,
            " ".join(["word"] * (LONG_TEXT // 5)),
            "no-such-preset-" + str(rng.randint(0, 10**6)),
            "/etc/passwd",
            "../../config.json",
            "\x00\x01\n\r\t",
            "",
            "{" * 1000,
            "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 64))),
        ])

    def random_message(self, descriptor: Descriptor, depth: int = 0) -> Message:
        """Every field drawn from its descriptor: set or not, boundary or small values, known
        words or odd strings, nested messages to a depth of 4."""
        msg = self.r.message_class(descriptor)()
        done_oneofs: set[str] = set()
        for f in descriptor.fields:
            oneof = f.containing_oneof
            if oneof is not None and len(oneof.fields) > 1:
                if oneof.name in done_oneofs or self.rng.random() < 0.5:
                    continue
                done_oneofs.add(oneof.name)
            if self.rng.random() < 0.35:
                continue
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                if depth >= 4:
                    continue
                if _is_repeated(f):
                    for _ in range(self.rng.randint(0, 2)):
                        getattr(msg, f.name).add().CopyFrom(
                            self.random_message(f.message_type, depth + 1))
                else:
                    getattr(msg, f.name).CopyFrom(self.random_message(f.message_type, depth + 1))
                continue
            if _is_repeated(f):
                values = [self.scalar(f) for _ in range(self.rng.randint(0, 4))]
                getattr(msg, f.name).extend(values)
            else:
                setattr(msg, f.name, self.scalar(f))
        return msg

    def scalar(self, f: FieldDescriptor) -> Any:
        rng = self.rng
        if f.type in INT_TYPES:
            if rng.random() < 0.5:
                return rng.choice(_int_edges(f))
            return rng.choice([rng.randint(0, 70), rng.choice([1, 2, 4, 8, 16, 64, 4096])])
        if f.type in FLOAT_TYPES:
            return rng.choice([0.0, -1.0, 1.0, 80.0, 1e300, float("nan"), float("inf"),
                               -float("inf"), rng.uniform(-10, 10)])
        if f.type == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if f.type == FieldDescriptor.TYPE_STRING:
            known = self.words.get(f.name)
            if f.name == "preset":
                known = self.models
            elif f.name == "gpu":
                known = self.gpus
            if known and rng.random() < 0.6:
                return rng.choice(known)
            return self.odd_string() if rng.random() < 0.3 else "".join(
                rng.choice("abcdefgh-_.0123456789") for _ in range(rng.randint(0, 12)))
        if f.type == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(rng.randint(0, 32))
        if f.type == FieldDescriptor.TYPE_ENUM:
            return rng.choice([v.number for v in f.enum_type.values])
        raise AssertionError(f"field type {f.type} of {f.full_name}")

    def malformed(self, method: str) -> Call:
        rng = self.rng
        valid = self.plausible(method).SerializeToString() if method != "ListPresets" else b""
        how = rng.choice(["random", "truncated", "flipped", "wire-type", "long-length",
                          "deep", "empty"])
        if how == "random":
            body = rng.randbytes(rng.randint(1, 256))
        elif how == "truncated" and len(valid) > 1:
            body = valid[: rng.randint(1, len(valid) - 1)]
        elif how == "flipped" and valid:
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            body = bytes(data)
        elif how == "wire-type":
            # Field 1 (model, a message) sent as a varint, then as a fixed64.
            body = rng.choice([b"\x08\x05", b"\x09" + bytes(8), b"\x0d\x01\x02\x03\x04"]) + valid
        elif how == "long-length":
            body = b"\x0a\xff\xff\xff\xff\x0f" + valid[:8]
        elif how == "deep":
            # A field-1 message nested 200 deep: past protobuf's recursion limit for some.
            body = b""
            for _ in range(200):
                body = b"\x0a" + _varint(len(body)) + body
        else:
            body = b""
        return Call(SERVICE, method, "malformed", body, how)

    def health_call(self) -> Call:
        method = self.r.health.methods_by_name["Check"]
        msg = self.r.request_class(method)()
        setattr(msg, "service", self.rng.choice(["", SERVICE, "nope", self.odd_string()[:200]]))
        return Call(HEALTH, "Check", "health", msg.SerializeToString())

    def _field(self, descriptor: Descriptor, path: Sequence[str]) -> FieldDescriptor:
        for name in path[:-1]:
            descriptor = descriptor.fields_by_name[name].message_type
        f: FieldDescriptor = descriptor.fields_by_name[path[-1]]
        return f


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@dataclass
class Outcome:
    call: Call
    code: grpc.StatusCode
    details: str
    latency_s: float


@dataclass
class Report:
    """What a run saw."""

    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def codes(self) -> Counter[str]:
        return Counter(o.code.name for o in self.outcomes)

    def kinds(self) -> Counter[str]:
        return Counter(o.call.kind for o in self.outcomes)

    def latency_quantile(self, q: float) -> float:
        values = sorted(o.latency_s for o in self.outcomes)
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0

    def defects(self, deadline_s: float, slack_s: float) -> list[str]:
        """Every outcome that breaks the contract, described in one line each: a status
        outside :data:`ALLOWED` (:data:`ALLOWED_HEALTH` for health checks), an error without a
        message or with internals in it, or a call that outlived its deadline by ``slack_s``."""
        bad = []
        for o in self.outcomes:
            allowed = ALLOWED_HEALTH if o.call.service == HEALTH else ALLOWED
            what = f"{o.call.method} [{o.call.kind} {o.call.note[:120]}]"
            if o.code not in allowed:
                bad.append(f"{what}: {o.code.name} {o.details[:300]!r}")
            elif o.code != grpc.StatusCode.OK and o.call.service == SERVICE:
                if not o.details.strip() or "\n" in o.details:
                    bad.append(f"{what}: {o.code.name} without a one-line message "
                               f"{o.details[:300]!r}")
                leaked = [w for w in INTERNALS if w in o.details]
                if leaked:
                    bad.append(f"{what}: internals {leaked} in {o.details[:300]!r}")
            if o.latency_s > deadline_s + slack_s:
                bad.append(f"{what}: {o.latency_s:.2f} s, past the {deadline_s} s deadline")
        return bad


def run(
    target: str,
    calls: Sequence[Call],
    *,
    clients: int = 8,
    deadline_s: float = 2.0,
    progress: Optional[Callable[[int], None]] = None,
) -> Report:
    """Sends every call to ``target`` from ``clients`` threads (each with its own channel) and
    collects the status, message and latency of each."""
    report = Report()
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        with grpc.insecure_channel(target) as channel:
            rpcs: dict[tuple[str, str], Any] = {}
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(calls):
                    return
                call = calls[i]
                key = (call.service, call.method)
                if key not in rpcs:
                    rpcs[key] = channel.unary_unary(f"/{call.service}/{call.method}")
                began = time.monotonic()
                try:
                    rpcs[key](call.body, timeout=deadline_s)
                    code, details = grpc.StatusCode.OK, ""
                except grpc.RpcError as e:
                    code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                    details = (e.details() if isinstance(e, grpc.Call) else "") or ""
                outcome = Outcome(call, code, details, time.monotonic() - began)
                with lock:
                    report.outcomes.append(outcome)
                    done = len(report.outcomes)
                if progress is not None and done % 1000 == 0:
                    progress(done)

    began = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.wall_s = time.monotonic() - began
    return report


MAX_RSS_MIB = 1024
"""The most peak resident memory a server process under test may reach. It starts near 100 MiB;
a request that made the server size something by a degree's value (the reproducers of issue 9)
took gigabytes."""


def peak_rss_mib(pid: int) -> float:
    """The peak resident set of process ``pid`` (``VmHWM``), in MiB (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")
