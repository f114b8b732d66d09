//! Enumerates, prunes, scores and ranks plans (being written).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::report::SearchResult;
use crate::space::SearchSpace;
use crate::Problem;

/// How a caller steers a long search: a cancel flag polled by the workers, a deadline, and the
/// number of worker threads (`None`: `MESHPLAN_THREADS`, else all cores).
#[derive(Debug, Clone, Default)]
pub struct Control {
    pub cancel: Option<Arc<AtomicBool>>,
    pub deadline: Option<Instant>,
    pub threads: Option<usize>,
}

/// Searches `space` for the best plans of `problem`.
pub fn search(problem: &Problem, space: &SearchSpace, control: &Control) -> Result<SearchResult> {
    let _ = (problem, space, control);
    todo!("search: being written")
}
