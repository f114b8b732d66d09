//! `meshplan._core`: the thin PyO3 layer over `meshplan-core`.
//!
//! Every function is a one-line adapter through [`run`]: the Python arguments are converted to
//! owned Rust values first ([`arg`], which names the field path of anything that does not fit),
//! then the GIL is released, the core is called, and its result is turned back into plain Python
//! data (dicts, lists, numbers, strings) with `pythonize`. Core errors become the classes of
//! `meshplan.errors` through one table ([`ERROR_CLASSES`]); a Rust panic becomes
//! `MeshplanError("internal error: ...")` instead of taking the interpreter down. The docstrings
//! users read live in `_core.pyi` and the Python layer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use meshplan_core::{self as core, Cluster, Control, Model, Plan, Problem, SearchSpace, Workload};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyType};
use pythonize::{pythonize, Depythonizer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `meshplan.errors` class for each [`core::Error::kind`] (exactly [`core::Error::KINDS`], in
/// order: checked by the tests, with the classes of `python/meshplan/errors.py`); anything else
/// is a `MeshplanError`.
const ERROR_CLASSES: &[(&str, &str)] = &[
    ("invalid_field", "InvalidInputError"),
    ("unknown_preset", "UnknownPresetError"),
    ("hf_config", "HfConfigError"),
    ("data_file", "DataFileError"),
    ("invalid_case", "InvalidCaseError"),
    ("space_too_large", "SpaceTooLargeError"),
    ("too_many_plans", "TooManyPlansError"),
    ("cancelled", "CancelledError"),
    ("deadline_exceeded", "DeadlineExceededError"),
];

/// How often a waiting search looks for Ctrl-C (Python signal handlers only run with the GIL).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The problem dict: `{"model": ..., "cluster": ..., "workload": ...}`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProblemArg {
    model: Model,
    cluster: Cluster,
    workload: Workload,
}

impl ProblemArg {
    /// Validates the three parts (a core call, so it runs without the GIL).
    fn validate(self) -> core::Result<Problem> {
        Problem::new(self.model, self.cluster, self.workload)
    }
}

/// Why a call into the core did not return a value.
enum Failure {
    Core(core::Error),
    Panic(String),
}

/// The typed context of an error: `(field, value, allowed)`, `None` where not applicable
/// ([`core::Error::context`]).
type Context = (Option<String>, Option<String>, Option<String>);

/// Raises the class `name` of `meshplan.errors` with `message`.
fn raise(py: Python<'_>, name: &str, message: String) -> PyErr {
    raise_with(py, name, message, (None, None, None))
}

/// Raises the class `name` of `meshplan.errors` with `message` and the typed context
/// `(field, value, allowed)` as the exception's attributes of those names.
fn raise_with(py: Python<'_>, name: &str, message: String, context: Context) -> PyErr {
    // One line whatever the offending value holds: control characters are escaped (`\n`).
    let mut one_line = String::with_capacity(message.len());
    for c in message.chars() {
        if c.is_control() {
            one_line.extend(c.escape_default());
        } else {
            one_line.push(c);
        }
    }
    let class = py
        .import("meshplan.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    let class = match class {
        Ok(class) => class,
        Err(import_error) => return import_error,
    };
    let (field, value, allowed) = context;
    let error = PyDict::new(py);
    let made = error
        .set_item("field", field)
        .and_then(|()| error.set_item("value", value))
        .and_then(|()| error.set_item("allowed", allowed))
        .and_then(|()| class.call((one_line,), Some(&error)));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(e) => e,
    }
}

/// The Python object at `path` under `root` (dict keys and sequence indices), if it is there.
fn value_at<'py>(
    root: &Bound<'py, PyAny>,
    path: &serde_path_to_error::Path,
) -> Option<Bound<'py, PyAny>> {
    use serde_path_to_error::Segment;
    let mut at = root.clone();
    for segment in path.iter() {
        at = match segment {
            Segment::Map { key } => at.get_item(key.as_str()).ok()?,
            Segment::Seq { index } => at.get_item(*index).ok()?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    Some(at)
}

/// A Python value as an error echoes it: an `int` in decimal, anything else its `repr()`,
/// bounded as the core bounds every echoed value ([`core::error::echo`]).
fn echo_value(value: &Bound<'_, PyAny>) -> String {
    let text = if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() {
        value.str()
    } else {
        value.repr()
    };
    let text = text.map_or_else(|_| "?".to_string(), |t| t.to_string());
    core::error::echo(&text).into_owned()
}

/// The path of [`core::limits::TABLE`] for a field path of an argument: list elements share
/// their list's limit (`space.zero[1]` → `space.zero`), and a GPU's fields are `gpu.*`
/// however it is nested (`cluster.gpu.sm_count`), as the core names them.
fn limit_path(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut depth = 0;
    for c in field.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    // A list of records (`collective.[0].group_size`) names its fields as one record's.
    let out = out.replace("..", ".");
    match out.strip_prefix("cluster.") {
        Some(rest) if rest.starts_with("gpu.") => rest.to_string(),
        _ => out,
    }
}

/// Converts a Python argument to an owned Rust value. On failure, raises `InvalidInputError`
/// naming the field path under `what` (e.g. `model.moe.top_k`, `plan.dp`, `space.zero[1]`):
///
/// - an integer field that gets anything but an integer of its type (negative, 2^32, 2^64, a
///   float, a string) is named with its limits, as the core names a value outside them:
///   `invalid cluster.num_gpus: -8 (allowed: 1..=1048576)` ([`core::limits::TABLE`]);
/// - a value of the wrong type elsewhere, `invalid model.name: 5 (allowed: a string)`;
/// - anything else keeps the deserializer's words (an unknown variant or field), with the
///   echoed value bounded.
fn arg<T: DeserializeOwned>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    convert(obj, what)
        .map_err(|(message, context)| raise_with(obj.py(), "InvalidInputError", message, context))
}

/// [`arg`] before the exception: the value, or the message and context of the failure.
fn convert<T: DeserializeOwned>(
    obj: &Bound<'_, PyAny>,
    what: &str,
) -> Result<T, (String, Context)> {
    serde_path_to_error::deserialize(&mut Depythonizer::from_object(obj)).map_err(|e| {
        let path = e.path().to_string();
        // The problem dict is the root of the core's field names (`model.layers`), so it has no
        // prefix of its own; every other argument is named by `what`.
        let field = match (what, path.as_str()) {
            ("", ".") => "problem".to_string(),
            ("", p) => p.to_string(),
            (w, ".") => w.to_string(),
            (w, p) => format!("{w}.{p}"),
        };
        let value = value_at(obj, e.path());
        let segments = e.path().clone();
        let mut inner = e.into_inner().to_string();
        if inner.contains("for enum") {
            // A non-string where a choice belongs: name the choices as for an unknown one.
            if let Some(choices) = enum_choices::<T>(obj, &segments) {
                inner = format!("invalid type: not a string, expected one of {choices}");
            }
        }
        conversion_message(&field, value.as_ref(), what, &path, &inner)
    })
}

/// The choices of the enum field at `path` of `T`, as its deserializer lists them for an
/// unknown name (`` `bf16`, `fp16`, ... ``): `obj` is converted again, copied, with a name that
/// is no choice at that path.
fn enum_choices<T: DeserializeOwned>(
    obj: &Bound<'_, PyAny>,
    path: &serde_path_to_error::Path,
) -> Option<String> {
    use serde_path_to_error::Segment;
    let py = obj.py();
    let copy = py
        .import("copy")
        .ok()?
        .call_method1("deepcopy", (obj,))
        .ok()?;
    let segments: Vec<&Segment> = path.iter().collect();
    let (last, parents) = segments.split_last()?;
    let mut at = copy.clone();
    for segment in parents {
        at = match segment {
            Segment::Map { key } => at.get_item(key.as_str()).ok()?,
            Segment::Seq { index } => at.get_item(*index).ok()?,
            _ => return None,
        };
    }
    let probe = "\u{1}";
    match last {
        Segment::Map { key } => at.set_item(key.as_str(), probe).ok()?,
        Segment::Seq { index } => at.set_item(*index, probe).ok()?,
        _ => return None,
    }
    let e =
        serde_path_to_error::deserialize::<_, T>(&mut Depythonizer::from_object(&copy)).err()?;
    let inner = e.into_inner().to_string();
    inner
        .strip_prefix("unknown variant `\u{1}`, expected ")
        .map(|choices| choices.trim_start_matches("one of ").to_string())
}

/// What a field wanted, from a conversion error that is about the value's type (serde's
/// `invalid type: ..., expected X`, pythonize's `... cannot be cast as 'Mapping'`, a Python
/// `TypeError`/`OverflowError` of a float), in the words of the other errors; `None` for the
/// errors that say more (unknown variants and fields, a missing field).
fn expected_type(inner: &str) -> Option<String> {
    if inner.starts_with("invalid type: ") || inner.starts_with("invalid value: ") {
        return inner.split_once(", expected ").map(|(_, e)| e.to_string());
    }
    let cast = inner
        .split_once("cannot be cast as '")
        .and_then(|(_, rest)| rest.split('\'').next());
    let wanted = match cast {
        Some("Mapping") => "a table (dict)",
        Some("Sequence") => "a list",
        Some("str") => "a string",
        Some(_) => "a value of the field's type",
        None if inner.contains("for enum") => "a string naming one of the field's choices",
        None if inner.contains("real number") || inner.contains("to float") => "a number",
        None => return None,
    };
    Some(wanted.to_string())
}

/// The message and context of a conversion failure at `field` (see [`arg`]).
fn conversion_message(
    field: &str,
    value: Option<&Bound<'_, PyAny>>,
    what: &str,
    path: &str,
    inner: &str,
) -> (String, Context) {
    if let Some(missing) = inner
        .strip_prefix("missing field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        let name = if what.is_empty() && path == "." {
            missing.to_string()
        } else {
            format!("{field}.{missing}")
        };
        let message = format!("missing {name} (a required field)");
        return (message, (Some(name), None, Some("a required field".into())));
    }
    let limit_field = limit_path(field);
    // A list or a table where an integer of the table belongs is named below, by its type.
    let shape = inner.contains("cannot be cast as 'Sequence'")
        || inner.contains("cannot be cast as 'Mapping'");
    if let (Some(limit), Some(value), false) = (core::limits::of(&limit_field), value, shape) {
        let shown = echo_value(value);
        let allowed = limit.allowed();
        let message = format!("invalid {limit_field}: {shown} (allowed: {allowed})");
        return (message, (Some(limit_field), Some(shown), Some(allowed)));
    }
    if let (Some(allowed), Some(value)) = (expected_type(inner), value) {
        let shown = echo_value(value);
        let allowed = core::error::detail(&allowed).into_owned();
        let message = format!("invalid {field}: {shown} (allowed: {allowed})");
        return (message, (Some(field.into()), Some(shown), Some(allowed)));
    }
    // `unknown variant `x`, expected ...` / `unknown field `x`, expected ...`: the name is the
    // caller's, bounded like every echoed value.
    for prefix in ["unknown variant `", "unknown field `"] {
        if let Some((name, rest)) = inner
            .strip_prefix(prefix)
            .and_then(|r| r.rfind("`, expected").map(|i| (&r[..i], &r[i..])))
        {
            let shown = core::error::echo(name);
            let message = format!(
                "invalid {field}: {prefix}{shown}{}",
                core::error::detail(rest)
            );
            let allowed = rest.trim_start_matches("`, expected ");
            let context = (
                Some(field.into()),
                Some(shown.into_owned()),
                Some(core::error::detail(allowed).into_owned()),
            );
            return (message, context);
        }
    }
    let message = format!("invalid {field}: {}", core::error::detail(inner));
    (message, (Some(field.into()), None, None))
}

/// Runs `work`, turning a panic into [`Failure::Panic`].
fn guarded<R>(work: impl FnOnce() -> core::Result<R>) -> Result<R, Failure> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result.map_err(Failure::Core),
        Err(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a Rust panic without a message".to_string());
            Err(Failure::Panic(text))
        }
    }
}

/// A Python callable `callback(done, total)` the waiting thread calls while a batch runs.
struct Progress {
    done: Arc<AtomicUsize>,
    total: usize,
    callback: Py<PyAny>,
}

impl Progress {
    fn report(&self, py: Python<'_>) -> PyResult<()> {
        let done = self.done.load(Ordering::Relaxed);
        self.callback.call1(py, (done, self.total)).map(drop)
    }
}

/// Runs `work` on a helper thread while this (GIL-free) thread polls for Ctrl-C (and reports
/// `progress`, when given); on an interrupt, or an exception from the progress callback, it
/// raises `flag` so the core stops, waits for it, and hands back the exception.
fn interruptible<R: Send>(
    flag: &AtomicBool,
    progress: Option<&Progress>,
    work: impl FnOnce() -> core::Result<R> + Send,
) -> (Result<R, Failure>, Option<PyErr>) {
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        s.spawn(move || tx.send(guarded(work)));
        let mut interrupt = None;
        loop {
            match rx.recv_timeout(SIGNAL_POLL) {
                Ok(outcome) => return (outcome, interrupt),
                Err(mpsc::RecvTimeoutError::Timeout) if interrupt.is_none() => {
                    let polled = Python::attach(|py| {
                        py.check_signals()?;
                        progress.map_or(Ok(()), |p| p.report(py))
                    });
                    if let Err(e) = polled {
                        flag.store(true, Ordering::SeqCst);
                        interrupt = Some(e);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let lost = Failure::Panic("the worker thread ended without a result".into());
                    return (Err(lost), interrupt);
                }
            }
        }
    })
}

/// The one path into the core: releases the GIL, calls `work` on the already-converted `inputs`
/// (interruptible by Ctrl-C when a cancel `flag` is given), maps errors and panics to
/// `meshplan.errors`, and returns the result as plain Python data.
fn run<I, R, F>(
    py: Python<'_>,
    inputs: I,
    flag: Option<Arc<AtomicBool>>,
    work: F,
) -> PyResult<Py<PyAny>>
where
    I: Send,
    R: Serialize + Send,
    F: FnOnce(I) -> core::Result<R> + Send,
{
    run_watched(py, inputs, flag, None, work)
}

/// [`run`], reporting `progress` while the work runs (only with a cancel `flag`).
fn run_watched<I, R, F>(
    py: Python<'_>,
    inputs: I,
    flag: Option<Arc<AtomicBool>>,
    progress: Option<Progress>,
    work: F,
) -> PyResult<Py<PyAny>>
where
    I: Send,
    R: Serialize + Send,
    F: FnOnce(I) -> core::Result<R> + Send,
{
    let (outcome, interrupt) = py.detach(move || match flag {
        None => (guarded(|| work(inputs)), None),
        Some(flag) => interruptible(&flag, progress.as_ref(), || work(inputs)),
    });
    if let Some(interrupt) = interrupt {
        return Err(interrupt);
    }
    match outcome {
        Ok(value) => pythonize(py, &value).map(Bound::unbind).map_err(|e| {
            raise(
                py,
                "MeshplanError",
                format!("internal error: cannot convert the result: {e}"),
            )
        }),
        Err(Failure::Core(e)) => Err(raise_with(py, error_class(&e), e.to_string(), e.context())),
        Err(Failure::Panic(text)) => Err(raise(
            py,
            "MeshplanError",
            format!("internal error: {text}"),
        )),
    }
}

/// The `meshplan.errors` class of a core error.
fn error_class(e: &core::Error) -> &'static str {
    ERROR_CLASSES
        .iter()
        .find(|(kind, _)| *kind == e.kind())
        .map_or("MeshplanError", |c| c.1)
}

/// The search controls: thread count, deadline, and a cancel flag (the caller's, or a fresh one
/// so that Ctrl-C can stop the search).
fn control(
    py: Python<'_>,
    threads: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Control> {
    let threads: Option<usize> = threads.map(|t| arg(t, "threads")).transpose()?;
    let timeout_s: Option<f64> = timeout_s.map(|t| arg(t, "timeout_s")).transpose()?;
    if let Some(n) = threads {
        let limit = core::limits::get("threads");
        if let Err(e) = limit.check("threads", n as u64) {
            return Err(raise_with(py, error_class(&e), e.to_string(), e.context()));
        }
    }
    let deadline = match timeout_s {
        // Bounded so that `Instant + Duration` cannot overflow.
        Some(t) if !(t.is_finite() && (0.0..1e9).contains(&t)) => {
            let message = format!(
                "invalid timeout_s: {t} (allowed: a finite number of seconds >= 0, or None)"
            );
            return Err(raise(py, "InvalidInputError", message));
        }
        Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
        None => None,
    };
    let flag = match cancel {
        Some(c) => c
            .cast::<CancelToken>()
            .map_err(|_| {
                raise(
                    py,
                    "InvalidInputError",
                    "invalid cancel: expected a CancelToken or None".into(),
                )
            })?
            .get()
            .flag
            .clone(),
        None => Arc::new(AtomicBool::new(false)),
    };
    Ok(Control {
        cancel: Some(flag),
        deadline,
        threads,
    })
}

/// A flag that stops a running search from another thread: pass it as `search(..., cancel=token)`
/// and call `token.cancel()`; the search then raises `CancelledError`.
#[pyclass(frozen, module = "meshplan._core")]
struct CancelToken {
    flag: Arc<AtomicBool>,
}

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> Self {
        CancelToken {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Asks every search holding this token to stop.
    fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether `cancel()` was called.
    #[getter]
    fn cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    fn __repr__(&self) -> String {
        format!(
            "CancelToken(cancelled={})",
            if self.cancelled() { "True" } else { "False" }
        )
    }
}

/// Names of the built-in model presets, sorted.
#[pyfunction]
fn model_presets(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| Ok(core::presets::model_names()))
}

/// The model aliases: `{name, preset, why}` dicts, sorted by name.
#[pyfunction]
fn model_aliases(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| Ok(core::presets::model_aliases()))
}

/// The model preset `name` as a dict.
#[pyfunction]
fn model_preset(py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    run(py, arg::<String>(name, "name")?, None, |name| {
        core::presets::model(&name)
    })
}

/// Names of the built-in GPU presets, sorted.
#[pyfunction]
fn gpu_presets(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| Ok(core::presets::gpu_names()))
}

/// The GPU preset `name` as a dict.
#[pyfunction]
fn gpu_preset(py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    run(py, arg::<String>(name, "name")?, None, |name| {
        core::presets::gpu(&name)
    })
}

/// Where each calibration constant of the GPU preset `name` comes from:
/// `{"summary": kind, "constants": {name: {"kind", "note"}}}`.
#[pyfunction]
fn gpu_provenance(py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    run(py, arg::<String>(name, "name")?, None, |name| {
        core::presets::gpu_provenance(&name).map(core::provenance::GpuProvenance::of)
    })
}

/// The class of the core's `matmul_realisation` (data/device.toml) a GPU of `architecture`
/// (None: unknown) belongs to, and that class's realisation: `(class, realisation)`.
#[pyfunction]
#[pyo3(signature = (architecture=None))]
fn matmul_realisation(
    py: Python<'_>,
    architecture: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let architecture = architecture
        .filter(|a| !a.is_none())
        .map(|a| arg::<String>(a, "architecture"))
        .transpose()?;
    run(py, architecture, None, |a| {
        let a = a.as_deref();
        Ok((
            core::device::realisation_class(a).to_string(),
            core::device::matmul_realisation(a),
        ))
    })
}

/// Every training stack profile of `data/stacks.toml` as a list of dicts, sorted by name.
#[pyfunction]
fn stacks(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| core::stack::Stack::all())
}

/// A model dict from the text of a Hugging Face `config.json`.
#[pyfunction]
#[pyo3(signature = (json_text, name=None))]
fn model_from_hf_config(
    py: Python<'_>,
    json_text: &Bound<'_, PyAny>,
    name: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<String>(json_text, "json_text")?,
        name.map(|n| arg::<Option<String>>(n, "name"))
            .transpose()?
            .flatten(),
    );
    run(py, inputs, None, |(text, name)| {
        core::hf::model_from_hf_config(&text, name.as_deref())
    })
}

/// The search space with every field at its default, as a dict.
#[pyfunction]
fn default_space(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| Ok(SearchSpace::default()))
}

/// The controls of a call that is fast unless absurd (evaluate, explain): `None` when neither a
/// deadline nor a cancel token is given, so the plain call runs as it always has (no helper
/// thread); else a [`control`] whose flag also stops the call on Ctrl-C.
fn optional_control(
    py: Python<'_>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Control>> {
    let given = |a: Option<&Bound<'_, PyAny>>| a.is_some_and(|a| !a.is_none());
    if given(timeout_s) || given(cancel) {
        control(py, None, timeout_s, cancel).map(Some)
    } else {
        Ok(None)
    }
}

/// The shared body of the one-plan calls (evaluate, explain): converts the problem dict, the
/// plan and the optional controls, then [`run`]s `work` on the validated problem, stoppable by
/// the controls' cancel flag when any was given (else under the default controls).
fn run_on_plan<R, F>(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
    work: F,
) -> PyResult<Py<PyAny>>
where
    R: Serialize + Send,
    F: FnOnce(Problem, Plan, Control) -> core::Result<R> + Send,
{
    let inputs = (
        arg::<ProblemArg>(problem, "")?,
        arg::<Plan>(plan, "plan")?,
        optional_control(py, timeout_s, cancel)?,
    );
    let flag = inputs.2.as_ref().and_then(|c| c.cancel.clone());
    run(py, inputs, flag, |(problem, plan, control)| {
        work(problem.validate()?, plan, control.unwrap_or_default())
    })
}

/// Scores one plan (feasible or not) on a problem dict.
#[pyfunction]
#[pyo3(signature = (problem, plan, timeout_s=None, cancel=None))]
fn evaluate(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    run_on_plan(
        py,
        problem,
        plan,
        timeout_s,
        cancel,
        |problem, plan, control| {
            core::evaluate_with(&problem, &plan, &SearchSpace::default(), &control)
        },
    )
}

/// Searches `space` (None: the default space) for the best plans of a problem dict.
#[pyfunction]
#[pyo3(signature = (problem, space=None, threads=None, timeout_s=None, cancel=None))]
fn search(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    space: Option<&Bound<'_, PyAny>>,
    threads: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let space: Option<SearchSpace> = space.map(|s| arg(s, "space")).transpose()?.flatten();
    let inputs = (
        arg::<ProblemArg>(problem, "")?,
        space.unwrap_or_default(),
        control(py, threads, timeout_s, cancel)?,
    );
    let flag = inputs.2.cancel.clone();
    run(py, inputs, flag, |(problem, space, control)| {
        core::search(&problem.validate()?, &space, &control)
    })
}

/// Validates the cost model against published runs: `cases_json` is the text of a case file
/// (schema: validation/README.md), `calibration` the text of a calibration-overrides file.
#[pyfunction]
#[pyo3(signature = (cases_json, search=false, calibration=None, threads=None))]
fn validate(
    py: Python<'_>,
    cases_json: &Bound<'_, PyAny>,
    search: bool,
    calibration: Option<&Bound<'_, PyAny>>,
    threads: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<String>(cases_json, "cases_json")?,
        calibration
            .map(|c| arg::<String>(c, "calibration"))
            .transpose()?,
        threads.map(|t| arg::<usize>(t, "threads")).transpose()?,
    );
    run(py, inputs, None, move |(cases, calibration, threads)| {
        let options = core::validation::ValidateOptions {
            search,
            calibration: calibration
                .as_deref()
                .map(core::calibration::parse_overrides)
                .transpose()?,
            threads,
        };
        core::validation::validate(&cases, &options)
    })
}

/// The summary of case rows (dicts as `validate` returns them, extra keys ignored): the same
/// `throughput`, `memory`, `by_gpu` and `by_arch` as `validate`'s own, for rows pooled from
/// elsewhere (cross-validation folds).
#[pyfunction]
fn summarise(py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let rows = arg::<Vec<core::validation::CaseRow>>(rows, "rows")?;
    run(py, rows, None, |rows| {
        Ok(core::validation::summarise(&rows, false))
    })
}

/// The `q`-quantile of `values` interpolated as NumPy does (`None` for no values): the one
/// percentile every validation summary uses.
#[pyfunction]
fn percentile(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (arg::<Vec<f64>>(values, "values")?, arg::<f64>(q, "q")?);
    run(py, inputs, None, |(values, q)| {
        if !(0.0..=1.0).contains(&q) {
            return Err(core::Error::invalid("q", q, "a number in [0, 1]"));
        }
        Ok(core::validation::percentile(&values, q))
    })
}

/// A GPU dict with the calibration overrides of `calibration` (TOML or JSON text) applied.
#[pyfunction]
fn apply_calibration(
    py: Python<'_>,
    gpu: &Bound<'_, PyAny>,
    calibration: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<core::Gpu>(gpu, "gpu")?,
        arg::<String>(calibration, "calibration")?,
    );
    run(py, inputs, None, |(mut gpu, text)| {
        let overrides = core::calibration::parse_overrides(&text)?;
        core::calibration::check_overrides(&overrides)?;
        core::calibration::apply_overrides(&overrides, &mut gpu)?;
        Ok(gpu)
    })
}

/// Each collective of `queries` (dicts `{kind, bytes, group_size, per_domain}`) priced on the
/// calibrated fabrics of `gpu` (a GPU dict), as the planner prices it: `meshplan calibrate`
/// fits measured nccl-tests times against these.
#[pyfunction]
fn collective_times(
    py: Python<'_>,
    gpu: &Bound<'_, PyAny>,
    queries: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<core::Gpu>(gpu, "gpu")?,
        arg::<Vec<core::comm::CollectiveQuery>>(queries, "collective")?,
    );
    run(py, inputs, None, |(gpu, queries)| {
        core::comm::price_collectives(&gpu, &queries)
    })
}

/// Seconds of each GEMM of `shapes` (`[m, n, k]` lists) on `gpu` (a GPU dict) at `precision`,
/// as the time model charges it: `meshplan calibrate` fits measured GEMM times against these.
#[pyfunction]
fn gemm_times(
    py: Python<'_>,
    gpu: &Bound<'_, PyAny>,
    precision: &Bound<'_, PyAny>,
    shapes: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<core::Gpu>(gpu, "gpu")?,
        arg::<core::Precision>(precision, "precision")?,
        arg::<Vec<[f64; 3]>>(shapes, "shapes")?,
    );
    run(py, inputs, None, |(gpu, precision, shapes)| {
        core::device::gemm_times_s(&gpu, precision, &shapes)
    })
}

/// Flash attention's rate at each kernel call length of `seqs` relative to the reference length
/// its `attention_efficiency` holds at (docs/costmodel.md §5.2).
#[pyfunction]
fn attention_length_factors(py: Python<'_>, seqs: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let inputs = arg::<Vec<f64>>(seqs, "seqs")?;
    run(py, inputs, None, |seqs| {
        core::device::attention_length_factors(&seqs)
    })
}

/// Layers per pipeline rank of `plan` (a plan dict) on a model of `layers` layers, as
/// `(ranks, layers each)` runs in rank order: the split the cost model times (`stages.rs`).
#[pyfunction]
fn rank_layer_counts(
    py: Python<'_>,
    layers: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<u32>(layers, "layers")?,
        arg::<core::Plan>(plan, "plan")?,
    );
    run(py, inputs, None, |(layers, plan)| {
        core::stages::rank_layer_counts(layers, &plan)
    })
}

/// Explains one plan axis by axis (sharding, collectives, bytes, fabric, time) on a problem dict.
#[pyfunction]
#[pyo3(signature = (problem, plan, timeout_s=None, cancel=None))]
fn explain(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    run_on_plan(
        py,
        problem,
        plan,
        timeout_s,
        cancel,
        |problem, plan, control| core::explain_with(&problem, &plan, &control),
    )
}

/// Searches the serving deployments of a serving-problem dict (`space`: a serving-space dict,
/// None for the default).
#[pyfunction]
#[pyo3(signature = (problem, space=None, timeout_s=None, cancel=None))]
fn search_serving(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    space: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let space: Option<core::serving::ServingSpace> = space
        .map(|s| arg(s, "serving_space"))
        .transpose()?
        .flatten();
    let inputs = (
        arg::<core::serving::ServingProblem>(problem, "")?,
        space.unwrap_or_default(),
        control(py, None, timeout_s, cancel)?,
    );
    let flag = inputs.2.cancel.clone();
    run(py, inputs, flag, |(problem, space, control)| {
        core::serving::search_serving(&problem, &space, &control)
    })
}

/// The shared body of evaluate_serving and explain_serving.
fn run_on_serving_plan<R, F>(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
    work: F,
) -> PyResult<Py<PyAny>>
where
    R: Serialize + Send,
    F: FnOnce(
            core::serving::ServingProblem,
            core::serving::ServingPlan,
            Control,
        ) -> core::Result<R>
        + Send,
{
    let inputs = (
        arg::<core::serving::ServingProblem>(problem, "")?,
        arg::<core::serving::ServingPlan>(plan, "serving_plan")?,
        optional_control(py, timeout_s, cancel)?,
    );
    let flag = inputs.2.as_ref().and_then(|c| c.cancel.clone());
    run(py, inputs, flag, |(problem, plan, control)| {
        work(problem, plan, control.unwrap_or_default())
    })
}

/// Scores one serving deployment (feasible or not) on a serving-problem dict.
#[pyfunction]
#[pyo3(signature = (problem, plan, timeout_s=None, cancel=None))]
fn evaluate_serving(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    run_on_serving_plan(py, problem, plan, timeout_s, cancel, |p, plan, c| {
        core::serving::evaluate_serving_with(&p, &plan, &c)
    })
}

/// The lengths a serving problem's evaluation reads (`ServingProblem::lengths`): its classes
/// (share, input, output) and their averages, checked first.
#[pyfunction]
fn serving_lengths(py: Python<'_>, problem: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let inputs = (arg::<core::serving::ServingProblem>(problem, "")?,);
    run(py, inputs, None, |(p,)| p.validate().map(|()| p.lengths()))
}

/// Explains one serving deployment axis by axis.
#[pyfunction]
#[pyo3(signature = (problem, plan, timeout_s=None, cancel=None))]
fn explain_serving(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    run_on_serving_plan(py, problem, plan, timeout_s, cancel, |p, plan, c| {
        core::serving::explain_serving(&p, &plan, &c)
    })
}

/// Every integer input's inclusive bounds by field path (`core::limits::TABLE`), in the
/// table's order: `{"cluster.num_gpus": (1, 1048576), ...}`.
#[pyfunction]
fn limits(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for (path, limit) in core::limits::TABLE {
        out.set_item(*path, (limit.lo, limit.hi))?;
    }
    Ok(out)
}

/// Tensor-parallel all-reduce traffic of batch-1 decoding (docs/costmodel.md §7(a)).
#[pyfunction]
fn decode_traffic(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    cluster: &Bound<'_, PyAny>,
    tp: &Bound<'_, PyAny>,
    tokens_per_s: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (
        arg::<Model>(model, "model")?,
        arg::<Cluster>(cluster, "cluster")?,
        arg::<u32>(tp, "tp")?,
        arg::<f64>(tokens_per_s, "tokens_per_s")?,
    );
    run(py, inputs, None, |(model, cluster, tp, rate)| {
        core::decode_traffic(&model, &cluster, tp, rate)
    })
}

/// Every rank order (the 120 permutations), the default first.
#[pyfunction]
fn rank_orders(py: Python<'_>) -> PyResult<Py<PyAny>> {
    run(py, (), None, |()| Ok(core::RankOrder::all()))
}

/// One column of a feasible space as `(name, NumPy dtype, native-endian bytes)`.
struct ColumnBytes(String, &'static str, Vec<u8>);

/// Bytes that serialise as Python `bytes` (not a list of numbers).
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl Serialize for ColumnBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.0)?;
        t.serialize_element(self.1)?;
        t.serialize_element(&Bytes(&self.2))?;
        t.end()
    }
}

impl From<(String, core::Column)> for ColumnBytes {
    fn from((name, column): (String, core::Column)) -> Self {
        let (dtype, bytes): (&str, Vec<u8>) = match column {
            core::Column::U8(v) => ("u1", v),
            core::Column::U32(v) => ("u4", v.iter().flat_map(|x| x.to_ne_bytes()).collect()),
            core::Column::F64(v) => ("f8", v.iter().flat_map(|x| x.to_ne_bytes()).collect()),
            core::Column::Bool(v) => ("?", v.into_iter().map(u8::from).collect()),
        };
        ColumnBytes(name, dtype, bytes)
    }
}

/// A feasible space for Python: columns as buffers, the coded columns' labels, the stats.
#[derive(Serialize)]
struct FeasibleColumns {
    columns: Vec<ColumnBytes>,
    categories: Vec<(String, Vec<String>)>,
    stats: core::SearchStats,
}

impl From<core::FeasibleSpace> for FeasibleColumns {
    fn from(fs: core::FeasibleSpace) -> Self {
        FeasibleColumns {
            columns: fs.columns.into_iter().map(ColumnBytes::from).collect(),
            categories: fs.categories,
            stats: fs.stats,
        }
    }
}

/// Every feasible plan of a problem dict in `space`, as column buffers (ranked best first).
#[pyfunction]
#[pyo3(signature = (problem, space=None, max_plans=None, threads=None, timeout_s=None, cancel=None))]
fn feasible_space(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    space: Option<&Bound<'_, PyAny>>,
    max_plans: Option<&Bound<'_, PyAny>>,
    threads: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let space: Option<SearchSpace> = space.map(|s| arg(s, "space")).transpose()?.flatten();
    let max_plans: Option<u64> = max_plans.map(|m| arg(m, "max_plans")).transpose()?;
    let inputs = (
        arg::<ProblemArg>(problem, "")?,
        space.unwrap_or_default(),
        max_plans.unwrap_or(core::DEFAULT_MAX_PLANS),
        control(py, threads, timeout_s, cancel)?,
    );
    let flag = inputs.3.cancel.clone();
    run(py, inputs, flag, |(problem, space, max_plans, control)| {
        core::feasible_space(&problem.validate()?, &space, &control, max_plans)
            .map(FeasibleColumns::from)
    })
}

/// One query's outcome in a batch: its result, or the `meshplan.errors` class and message of
/// what went wrong with it alone.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Ok(core::SearchResult),
    /// The error's class and message, and its typed context (`None` where not applicable).
    Error {
        class: String,
        message: String,
        field: Option<String>,
        value: Option<String>,
        allowed: Option<String>,
    },
}

impl Outcome {
    fn of(result: core::Result<core::SearchResult>) -> Self {
        match result {
            Ok(r) => Outcome::Ok(r),
            Err(e) => {
                let (field, value, allowed) = e.context();
                Outcome::Error {
                    class: error_class(&e).to_string(),
                    message: e.to_string(),
                    field,
                    value,
                    allowed,
                }
            }
        }
    }

    /// The outcome of a query whose conversion raised `e`.
    fn raised(py: Python<'_>, e: &PyErr) -> Self {
        let value = e.value(py);
        let attr = |name: &str| -> Option<String> {
            value
                .getattr(name)
                .ok()
                .filter(|v| !v.is_none())
                .map(|v| v.to_string())
        };
        Outcome::Error {
            class: e
                .get_type(py)
                .name()
                .map_or("MeshplanError".into(), |n| n.to_string()),
            message: value.to_string(),
            field: attr("field"),
            value: attr("value"),
            allowed: attr("allowed"),
        }
    }
}

/// One query of a batch: `(problem, space)`, `space` None for the default.
fn query_arg(item: &Bound<'_, PyAny>) -> PyResult<(ProblemArg, SearchSpace)> {
    let (problem, space): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract().map_err(|_| {
        raise(
            item.py(),
            "InvalidInputError",
            "invalid query: expected a (problem, space) pair".into(),
        )
    })?;
    let problem: ProblemArg = arg(&problem, "")?;
    let space: Option<SearchSpace> = arg(&space, "space")?;
    Ok((problem, space.unwrap_or_default()))
}

/// Searches a batch of `(problem, space)` queries in parallel (one pool, GIL released) and
/// returns one outcome per query, in order: `{"ok": result}` or
/// `{"error": {"class", "message", "field", "value", "allowed"}}`.
/// `progress(done, total)` is called every 50 ms while the batch runs.
#[pyfunction]
#[pyo3(signature = (queries, threads=None, timeout_s=None, cancel=None, progress=None))]
fn search_many(
    py: Python<'_>,
    queries: &Bound<'_, PyAny>,
    threads: Option<&Bound<'_, PyAny>>,
    timeout_s: Option<&Bound<'_, PyAny>>,
    cancel: Option<&Bound<'_, PyAny>>,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    // Each query is converted on its own, so that one malformed query is its own error.
    let mut items: Vec<Result<(ProblemArg, SearchSpace), Outcome>> = Vec::new();
    for item in queries.try_iter()? {
        items.push(query_arg(&item?).map_err(|e| Outcome::raised(py, &e)));
    }
    let control = control(py, threads, timeout_s, cancel)?;
    let flag = control.cancel.clone();
    let done = Arc::new(AtomicUsize::new(0));
    let watch = progress.map(|callback| Progress {
        done: done.clone(),
        total: items.len(),
        callback: callback.clone().unbind(),
    });
    run_watched(
        py,
        (items, control),
        flag,
        watch,
        move |(items, control)| {
            let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(items.len());
            let mut queries = Vec::new();
            for item in items {
                match item.map(|(p, s)| p.validate().map(|p| (p, s))) {
                    Ok(Ok(query)) => {
                        queries.push(query);
                        outcomes.push(None);
                    }
                    Ok(Err(e)) => outcomes.push(Some(Outcome::of(Err(e)))),
                    Err(outcome) => outcomes.push(Some(outcome)),
                }
            }
            done.fetch_add(outcomes.len() - queries.len(), Ordering::Relaxed);
            let mut results = core::search_many(&queries, &control, Some(&done))?.into_iter();
            Ok(outcomes
                .into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| {
                        Outcome::of(results.next().unwrap_or(Err(core::Error::Cancelled)))
                    })
                })
                .collect::<Vec<_>>())
        },
    )
}

/// The module `meshplan._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Most classes of a serving problem's length distribution (`traffic.lengths`).
    m.add("MAX_LENGTH_CLASSES", core::serving::MAX_LENGTH_CLASSES)?;
    m.add_class::<CancelToken>()?;
    m.add_function(wrap_pyfunction!(model_presets, m)?)?;
    m.add_function(wrap_pyfunction!(model_preset, m)?)?;
    m.add_function(wrap_pyfunction!(model_aliases, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_presets, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_preset, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_provenance, m)?)?;
    m.add_function(wrap_pyfunction!(matmul_realisation, m)?)?;
    m.add_function(wrap_pyfunction!(stacks, m)?)?;
    m.add_function(wrap_pyfunction!(model_from_hf_config, m)?)?;
    m.add_function(wrap_pyfunction!(default_space, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(summarise, m)?)?;
    m.add_function(wrap_pyfunction!(percentile, m)?)?;
    m.add_function(wrap_pyfunction!(apply_calibration, m)?)?;
    m.add_function(wrap_pyfunction!(collective_times, m)?)?;
    m.add_function(wrap_pyfunction!(gemm_times, m)?)?;
    m.add_function(wrap_pyfunction!(attention_length_factors, m)?)?;
    m.add_function(wrap_pyfunction!(rank_layer_counts, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(decode_traffic, m)?)?;
    m.add_function(wrap_pyfunction!(rank_orders, m)?)?;
    m.add_function(wrap_pyfunction!(feasible_space, m)?)?;
    m.add_function(wrap_pyfunction!(search_many, m)?)?;
    m.add_function(wrap_pyfunction!(limits, m)?)?;
    m.add_function(wrap_pyfunction!(search_serving, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate_serving, m)?)?;
    m.add_function(wrap_pyfunction!(explain_serving, m)?)?;
    m.add_function(wrap_pyfunction!(serving_lengths, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `python/meshplan/errors.py`, the Python side of [`ERROR_CLASSES`].
    fn errors_py() -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../python/meshplan/errors.py");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn the_error_table_covers_every_core_kind_and_every_python_class() {
        // Exactly the core's kinds, in order, each with a class of its own.
        let kinds: Vec<&str> = ERROR_CLASSES.iter().map(|c| c.0).collect();
        assert_eq!(kinds, core::Error::KINDS.to_vec());
        let mut classes: Vec<&str> = ERROR_CLASSES.iter().map(|c| c.1).collect();
        classes.sort_unstable();
        classes.dedup();
        assert_eq!(
            classes.len(),
            ERROR_CLASSES.len(),
            "two kinds share a class"
        );
        // errors.py defines each class, lists it in its docstring table against its kind and in
        // __all__, and defines no other (MeshplanError aside, the base and the panic class).
        let source = errors_py();
        let mut defined: Vec<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("class "))
            .filter_map(|l| l.split('(').next())
            .filter(|name| *name != "MeshplanError")
            .collect();
        defined.sort_unstable();
        assert_eq!(defined, classes, "errors.py classes vs ERROR_CLASSES");
        for (kind, class) in ERROR_CLASSES {
            let row = source
                .lines()
                .find(|l| l.split_whitespace().next() == Some(kind))
                .unwrap_or_else(|| panic!("errors.py's table has no row for {kind}"));
            assert_eq!(row.split_whitespace().nth(1), Some(*class), "{row}");
            assert!(
                source.contains(&format!("\"{class}\",")),
                "{class} not in __all__"
            );
        }
        // Too many plans is a kind of space too large: existing `except` clauses still work.
        assert!(source.contains("class TooManyPlansError(SpaceTooLargeError)"));
    }

    #[test]
    fn limit_paths_drop_indices_and_nesting_of_the_gpu() {
        assert_eq!(limit_path("space.zero[1]"), "space.zero");
        assert_eq!(limit_path("cluster.gpu.sm_count"), "gpu.sm_count");
        assert_eq!(limit_path("cluster.num_gpus"), "cluster.num_gpus");
        assert_eq!(
            limit_path("collective.[3].group_size"),
            "collective.group_size"
        );
        for (path, _) in core::limits::TABLE {
            assert_eq!(limit_path(path), *path);
        }
    }

    #[test]
    fn integers_that_do_not_fit_are_named_with_their_limits() {
        Python::initialize();
        Python::attach(|py| {
            let plan = |dp: &str| {
                py.eval(
                    &std::ffi::CString::new(format!("{{'dp': {dp}, 'tp': 1, 'pp': 1}}")).unwrap(),
                    None,
                    None,
                )
                .unwrap()
            };
            let message = |dp: &str| convert::<Plan>(&plan(dp), "plan").unwrap_err();
            for (dp, shown) in [
                ("-64", "-64"),
                ("2**32", "4294967296"),
                ("2**64 - 1", "18446744073709551615"),
                ("10**30", "1000000000000000000000000000000"),
                ("8.0", "8.0"),
                ("'64'", "'64'"),
                ("None", "None"),
            ] {
                let (text, (field, value, allowed)) = message(dp);
                assert_eq!(
                    text,
                    format!("invalid plan.dp: {shown} (allowed: 1..=1048576)")
                );
                assert_eq!(field.as_deref(), Some("plan.dp"));
                assert_eq!(value.as_deref(), Some(shown));
                assert_eq!(allowed.as_deref(), Some("1..=1048576"));
            }
            // A huge integer is echoed bounded.
            let (text, (_, value, _)) = message("10**200");
            assert!(text.len() < 120, "{text}");
            assert!(value.unwrap().ends_with('…'));
            // Values of the wrong type elsewhere are named by what the field takes.
            let eval = |text: &str| {
                py.eval(&std::ffi::CString::new(text).unwrap(), None, None)
                    .unwrap()
            };
            let plan_error = |text: &str| convert::<Plan>(&eval(text), "plan").unwrap_err().0;
            assert_eq!(
                plan_error("{'dp': 8, 'tp': 1, 'pp': 1, 'recompute': 7}"),
                "invalid plan.recompute: 7 (allowed: one of `none`, `selective`, `full`, `selective-op`)"
            );
            assert_eq!(
                plan_error("{'dp': 8, 'tp': 1, 'pp': 1, 'order': 5}"),
                "invalid plan.order: 5 (allowed: a string)"
            );
            assert_eq!(
                plan_error("'dp=8'"),
                "invalid plan: 'dp=8' (allowed: a table (dict))"
            );
            let space_error =
                |text: &str| convert::<SearchSpace>(&eval(text), "space").unwrap_err().0;
            assert_eq!(
                space_error("{'zero': 5}"),
                "invalid space.zero: 5 (allowed: a list)"
            );
            assert_eq!(
                space_error("{'zero': [1, 300]}"),
                "invalid space.zero: 300 (allowed: 0..=3)"
            );
            assert_eq!(
                space_error("{'memory_headroom_gib': 10**400}"),
                format!(
                    "invalid space.memory_headroom_gib: {} (allowed: a number)",
                    core::error::echo(&format!("1{}", "0".repeat(400)))
                )
            );
            // The limits table as Python sees it.
            let table = limits(py).unwrap();
            assert_eq!(table.len(), core::limits::TABLE.len());
            let gpus: (u64, u64) = table
                .get_item("cluster.num_gpus")
                .unwrap()
                .unwrap()
                .extract()
                .unwrap();
            assert_eq!(gpus, (1, core::limits::MAX_GPUS as u64));
        });
    }

    #[test]
    fn guarded_turns_a_panic_into_a_failure() {
        match guarded::<()>(|| panic!("boom {}", 7)) {
            Err(Failure::Panic(text)) => assert_eq!(text, "boom 7"),
            _ => panic!("the panic was not caught"),
        }
        assert!(matches!(guarded(|| Ok(3)), Ok(3)));
        assert!(matches!(
            guarded::<()>(|| Err(core::Error::Cancelled)),
            Err(Failure::Core(core::Error::Cancelled))
        ));
    }

    #[test]
    fn interruptible_returns_the_work_result() {
        // The waiting thread attaches to Python to look for Ctrl-C while the work runs.
        Python::initialize();
        let flag = AtomicBool::new(false);
        let (outcome, interrupt) = interruptible(&flag, None, || {
            std::thread::sleep(3 * SIGNAL_POLL);
            Ok(41 + 1)
        });
        assert!(matches!(outcome, Ok(42)));
        assert!(interrupt.is_none() && !flag.load(Ordering::SeqCst));
    }
}
