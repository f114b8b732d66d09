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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use meshplan_core::{self as core, Cluster, Control, Model, Plan, Problem, SearchSpace, Workload};
use pyo3::prelude::*;
use pyo3::types::PyType;
use pythonize::{pythonize, Depythonizer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `meshplan.errors` class for each [`core::Error::kind`]; anything else is a `MeshplanError`.
const ERROR_CLASSES: &[(&str, &str)] = &[
    ("invalid_field", "InvalidInputError"),
    ("unknown_preset", "UnknownPresetError"),
    ("hf_config", "HfConfigError"),
    ("data_file", "DataFileError"),
    ("invalid_case", "InvalidCaseError"),
    ("space_too_large", "SpaceTooLargeError"),
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

/// Raises the class `name` of `meshplan.errors` with `message`.
fn raise(py: Python<'_>, name: &str, message: String) -> PyErr {
    let class = py
        .import("meshplan.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, message),
        Err(import_error) => import_error,
    }
}

/// Converts a Python argument to an owned Rust value. On failure, raises `InvalidInputError`
/// naming the field path under `what` (e.g. `model.moe.top_k`, `plan.dp`, `space.zero[1]`).
fn arg<T: DeserializeOwned>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
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
        let inner = e.into_inner().to_string();
        let message = match inner
            .strip_prefix("missing field `")
            .and_then(|r| r.strip_suffix('`'))
        {
            Some(missing) if what.is_empty() && path == "." => {
                format!("missing {missing} (a required field)")
            }
            Some(missing) => format!("missing {field}.{missing} (a required field)"),
            None => format!("invalid {field}: {inner}"),
        };
        raise(obj.py(), "InvalidInputError", message)
    })
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

/// Runs `work` on a helper thread while this (GIL-free) thread polls for Ctrl-C; on an
/// interrupt it raises `flag` so the core stops, waits for it, and hands back the interrupt.
fn interruptible<R: Send>(
    flag: &AtomicBool,
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
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
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
    let (outcome, interrupt) = py.detach(move || match flag {
        None => (guarded(|| work(inputs)), None),
        Some(flag) => interruptible(&flag, || work(inputs)),
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
        Err(Failure::Core(e)) => {
            let class = ERROR_CLASSES
                .iter()
                .find(|(kind, _)| *kind == e.kind())
                .map_or("MeshplanError", |c| c.1);
            Err(raise(py, class, e.to_string()))
        }
        Err(Failure::Panic(text)) => Err(raise(
            py,
            "MeshplanError",
            format!("internal error: {text}"),
        )),
    }
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
    if threads == Some(0) {
        return Err(raise(
            py,
            "InvalidInputError",
            "invalid threads: 0 (allowed: an integer >= 1, or None)".into(),
        ));
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

/// Scores one plan (feasible or not) on a problem dict.
#[pyfunction]
fn evaluate(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (arg::<ProblemArg>(problem, "")?, arg::<Plan>(plan, "plan")?);
    run(py, inputs, None, |(problem, plan)| {
        core::evaluate(&problem.validate()?, &plan)
    })
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
/// (shared/validation schema), `calibration` the text of a calibration-overrides file.
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

/// Explains one plan axis by axis (sharding, collectives, bytes, fabric, time) on a problem dict.
#[pyfunction]
fn explain(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    plan: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let inputs = (arg::<ProblemArg>(problem, "")?, arg::<Plan>(plan, "plan")?);
    run(py, inputs, None, |(problem, plan)| {
        core::explain(&problem.validate()?, &plan)
    })
}

/// Tensor-parallel all-reduce traffic of batch-1 decoding (COSTMODEL §7(a)).
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

/// The module `meshplan._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<CancelToken>()?;
    m.add_function(wrap_pyfunction!(model_presets, m)?)?;
    m.add_function(wrap_pyfunction!(model_preset, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_presets, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_preset, m)?)?;
    m.add_function(wrap_pyfunction!(model_from_hf_config, m)?)?;
    m.add_function(wrap_pyfunction!(default_space, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(apply_calibration, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(decode_traffic, m)?)?;
    m.add_function(wrap_pyfunction!(rank_orders, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every kind the core can return.
    fn every_error() -> Vec<core::Error> {
        vec![
            core::Error::invalid("model.layers", 0, "an integer >= 1"),
            core::Error::UnknownPreset {
                kind: "model",
                name: "x".into(),
                available: "y".into(),
            },
            core::Error::HfConfig {
                field: "model_type".into(),
                reason: "missing".into(),
            },
            core::Error::DataFile {
                what: "data/gpus.toml".into(),
                reason: "bad".into(),
            },
            core::Error::SpaceTooLarge {
                candidates: 2,
                limit: 1,
            },
            core::Error::InvalidCase {
                index: 0,
                id: "x".into(),
                reason: "missing field".into(),
            },
            core::Error::Cancelled,
            core::Error::DeadlineExceeded { elapsed_s: 1.0 },
        ]
    }

    #[test]
    fn every_core_error_kind_has_its_own_python_class() {
        let errors = every_error();
        for e in &errors {
            assert!(
                ERROR_CLASSES.iter().any(|(kind, _)| *kind == e.kind()),
                "no Python class for {}",
                e.kind()
            );
        }
        let mut classes: Vec<&str> = ERROR_CLASSES.iter().map(|c| c.1).collect();
        classes.sort_unstable();
        classes.dedup();
        assert_eq!(
            classes.len(),
            ERROR_CLASSES.len(),
            "two kinds share a class"
        );
        assert_eq!(ERROR_CLASSES.len(), errors.len());
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
        let (outcome, interrupt) = interruptible(&flag, || {
            std::thread::sleep(3 * SIGNAL_POLL);
            Ok(41 + 1)
        });
        assert!(matches!(outcome, Ok(42)));
        assert!(interrupt.is_none() && !flag.load(Ordering::SeqCst));
    }
}
