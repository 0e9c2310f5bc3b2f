//! The public view of the plans `segments = auto` functions made: [`function_plans`],
//! [`explain`], [`clear_function_plans`] (re-exported by [`crate::plan`]).

use std::sync::Mutex;

use super::chain::FnChain;
use crate::lock;
use crate::plan::Plan;

/// Every chain that has planned, for [`function_plans`].
pub(super) static REGISTRY: Mutex<Vec<&'static FnChain>> = Mutex::new(Vec::new());

/// A plan made for a `#[checkpointed(segments = auto)]` (or `budget = ".."`) function.
#[derive(Debug, Clone)]
pub struct FunctionPlan {
    /// The function: `Type::method (src/model.rs:42)` for a method (the line of its first
    /// statement), `name (file:line)` for a free function.
    pub function: String,
    /// The input it was made for: shapes, dtypes and devices of the argument tensors.
    pub input: String,
    /// The plan; its stages are the function's statements, a layer loop counting one
    /// stage per iteration; the last statement is the last stage when it passes the
    /// side-effect rules (it is then profiled too), else it is left out.
    pub plan: Plan,
}

/// The plans made so far by every `#[checkpointed(segments = auto)]` and
/// `#[checkpointed(budget = "..")]` function of the program (one per function and
/// input, at most [`MAX_PLANS_PER_FUNCTION`](crate::plan::MAX_PLANS_PER_FUNCTION) each), each function's oldest first. Print one
/// with `Display` or [`Plan::explain`].
pub fn function_plans() -> Vec<FunctionPlan> {
    let chains: Vec<&'static FnChain> = lock(&REGISTRY).clone();
    let mut out = Vec::new();
    for c in chains {
        for (key, plan) in c.plans().iter() {
            out.push(FunctionPlan {
                function: c
                    .display
                    .get()
                    .cloned()
                    .unwrap_or_else(|| c.name.to_owned()),
                input: key.describe(),
                plan: plan.clone(),
            });
        }
    }
    out
}

/// [`Plan::explain`] of every plan [`function_plans`] lists, each under its function and
/// input: per stage (a statement, or an iteration of a layer loop) its name, the segment
/// that holds it, its input and kept bytes and its forward time.
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// // after a training step of the model:
/// println!("{}", ckpt::plan::explain());
/// ```
pub fn explain() -> String {
    function_plans()
        .iter()
        .map(|p| format!("{}, input {}:\n{}", p.function, p.input, p.plan.explain()))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Forgets the plans of every `#[checkpointed(segments = auto)]` / `budget` function: the
/// next training call of each profiles and plans again.
pub fn clear_function_plans() {
    let chains: Vec<&'static FnChain> = lock(&REGISTRY).clone();
    for c in chains {
        c.plans().clear();
    }
}
