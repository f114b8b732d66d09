//! Scores one plan: feasibility rules, memory, time (being written).

use crate::error::Result;
use crate::plan::Plan;
use crate::report::Evaluation;
use crate::Problem;

/// Scores `plan` on `problem`. An infeasible plan is still scored, with `feasible = false` and
/// its reasons; an error means the plan is malformed (zero degrees, product ≠ GPU count).
pub fn evaluate(problem: &Problem, plan: &Plan) -> Result<Evaluation> {
    let _ = (problem, plan);
    todo!("evaluate: being written")
}
