//! Running a chain of modules with a [`Plan`] ([`checkpoint_sequential_plan`]) and
//! [`SequentialPlanner`], which profiles, plans and runs with a plan cached per input shape.

use std::collections::HashMap;

use tch::nn::{Module, ModuleT};
use tch::{Device, Kind, Tensor};

use super::{Objective, Plan, f_profile_sequential, f_profile_sequential_t};
use crate::checkpoint;
use crate::sequential::{chain, run_chain};
use crate::{CkptError, ShallowClone};

fn check_len(modules: usize, plan: &Plan) -> Result<(), CkptError> {
    if modules != plan.len() {
        return Err(CkptError::InvalidArgument(format!(
            "the plan is for a chain of {} stages, but {modules} modules were given",
            plan.len()
        )));
    }
    Ok(())
}

/// Runs `input` through `modules` in order, cut as `plan` says: each segment but the
/// last runs as [`Plan::mode`] says (checkpointed with its policy, or kept: inline, with
/// grad), the last runs plainly. This is
/// [`checkpoint_sequential`](crate::checkpoint_sequential) with arbitrary cut points
/// (a [`Plan`] from [`ChainCost::plan`](super::ChainCost::plan), or any cuts through [`ChainCost::evaluate`](super::ChainCost::evaluate)).
///
/// # Panics
///
/// When [`f_checkpoint_sequential_plan`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_plan<M>(modules: &[M], plan: &Plan, input: &Tensor) -> Tensor
where
    M: Module + ShallowClone + 'static,
{
    f_checkpoint_sequential_plan(modules, plan, input).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_plan`].
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] when the plan is for a chain of another length; as
/// [`crate::f_checkpoint`] for a failing module.
#[track_caller]
pub fn f_checkpoint_sequential_plan<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
) -> Result<Tensor, CkptError>
where
    M: Module + ShallowClone + 'static,
{
    check_len(modules.len(), plan)?;
    run_chain(
        modules,
        &plan.ranges(),
        plan.modes(),
        input,
        |m: &M, xs: &Tensor| m.forward(xs),
    )
}

/// [`checkpoint_sequential_plan`] for [`ModuleT`] modules, with the train flag.
///
/// # Panics
///
/// When [`f_checkpoint_sequential_plan_t`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_plan_t<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
    train: bool,
) -> Tensor
where
    M: ModuleT + ShallowClone + 'static,
{
    f_checkpoint_sequential_plan_t(modules, plan, input, train).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_plan_t`].
///
/// # Errors
///
/// As [`f_checkpoint_sequential_plan`].
#[track_caller]
pub fn f_checkpoint_sequential_plan_t<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
    train: bool,
) -> Result<Tensor, CkptError>
where
    M: ModuleT + ShallowClone + 'static,
{
    check_len(modules.len(), plan)?;
    run_chain(
        modules,
        &plan.ranges(),
        plan.modes(),
        input,
        move |m: &M, xs: &Tensor| m.forward_t(xs, train),
    )
}

/// The chain run plainly (under `no_grad`), a panic of a module being
/// [`CkptError::ClosurePanicked`] as in a checkpointed run.
fn plain_chain<M>(
    modules: &[M],
    input: &Tensor,
    step: impl Fn(&M, &Tensor) -> Tensor,
) -> Result<Tensor, CkptError> {
    checkpoint::run_plain(
        || {
            format!(
                "SequentialPlanner chain (modules 0..{}, no grad)",
                modules.len()
            )
        },
        || chain(modules, input.shallow_clone(), step),
    )
}

/// The key of a cached plan: what the profile depends on besides the modules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InputKey {
    size: Vec<i64>,
    kind: Kind,
    device: Device,
    train: Option<bool>,
}

impl InputKey {
    pub(crate) fn new(input: &Tensor, train: Option<bool>) -> Self {
        InputKey {
            size: input.size(),
            kind: input.kind(),
            device: input.device(),
            train,
        }
    }
}

/// `checkpoint_sequential` with the cuts chosen for you: on the first call for an input
/// shape (size, dtype, device, train flag) it profiles the chain
/// ([`profile_sequential`](super::profile_sequential)), plans for its [`Objective`] ([`ChainCost::plan`](super::ChainCost::plan)) and
/// caches the plan; every call runs the chain with the cached plan
/// ([`checkpoint_sequential_plan`]).
///
/// One planner belongs to one chain of modules: the cache is keyed by the input alone.
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::plan::{Budget, Objective, SequentialPlanner};
/// # fn f(layers: &[tch::nn::Linear], xs: &tch::Tensor) {
/// let mut planner = SequentialPlanner::new(Objective::Budget("40%".parse().unwrap()));
/// let ys = planner.forward(layers, xs); // profiles and plans on the first call
/// println!("{}", planner.plan_for(xs, None).unwrap());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SequentialPlanner {
    objective: Objective,
    plans: HashMap<InputKey, Plan>,
}

impl SequentialPlanner {
    /// A planner with an empty cache.
    pub fn new(objective: Objective) -> Self {
        SequentialPlanner {
            objective,
            plans: HashMap::new(),
        }
    }

    /// What the planner optimises.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// The cached plan for inputs like `input` (`train`: `None` for [`Module`] chains,
    /// the flag for [`ModuleT`] ones), if that shape was planned.
    pub fn plan_for(&self, input: &Tensor, train: Option<bool>) -> Option<&Plan> {
        self.plans.get(&InputKey::new(input, train))
    }

    /// Forgets every cached plan.
    pub fn clear(&mut self) {
        self.plans.clear();
    }

    /// The plan for `input`: the cached one, or a new one from a profile of `modules`.
    ///
    /// # Errors
    ///
    /// As [`f_profile_sequential`] and [`ChainCost::plan`](super::ChainCost::plan) (notably
    /// [`CkptError::BudgetTooSmall`]).
    pub fn f_plan<M: Module>(&mut self, modules: &[M], input: &Tensor) -> Result<&Plan, CkptError> {
        let objective = self.objective;
        self.plan_with(InputKey::new(input, None), || {
            f_profile_sequential(modules, input)?.plan(&objective)
        })
    }

    /// [`SequentialPlanner::f_plan`] for [`ModuleT`] modules.
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_plan`].
    pub fn f_plan_t<M: ModuleT>(
        &mut self,
        modules: &[M],
        input: &Tensor,
        train: bool,
    ) -> Result<&Plan, CkptError> {
        let objective = self.objective;
        self.plan_with(InputKey::new(input, Some(train)), || {
            f_profile_sequential_t(modules, input, train)?.plan(&objective)
        })
    }

    fn plan_with(
        &mut self,
        key: InputKey,
        make: impl FnOnce() -> Result<Plan, CkptError>,
    ) -> Result<&Plan, CkptError> {
        use std::collections::hash_map::Entry;
        match self.plans.entry(key) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(make()?)),
        }
    }

    /// Runs `input` through `modules` with the plan for its shape (profiling and planning
    /// on first sight). Under `no_grad` it runs the chain plainly and plans nothing.
    ///
    /// # Panics
    ///
    /// When [`SequentialPlanner::f_forward`] returns an error.
    #[track_caller]
    pub fn forward<M>(&mut self, modules: &[M], input: &Tensor) -> Tensor
    where
        M: Module + ShallowClone + 'static,
    {
        self.f_forward(modules, input)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fallible twin of [`SequentialPlanner::forward`].
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_plan`] and [`f_checkpoint_sequential_plan`].
    #[track_caller]
    pub fn f_forward<M>(&mut self, modules: &[M], input: &Tensor) -> Result<Tensor, CkptError>
    where
        M: Module + ShallowClone + 'static,
    {
        let step = |m: &M, xs: &Tensor| m.forward(xs);
        // Nested in a segment with a policy, the chain's calls stay out of its cache: it
        // runs plainly without grad and the plan with grad.
        let _off = crate::ffi::OutsidePolicy::enter();
        if !crate::ffi::grad_enabled() {
            return plain_chain(modules, input, step);
        }
        let plan = self.f_plan(modules, input)?;
        check_len(modules.len(), plan)?;
        run_chain(modules, &plan.ranges(), plan.modes(), input, step)
    }

    /// [`SequentialPlanner::forward`] for [`ModuleT`] modules, with the train flag.
    ///
    /// # Panics
    ///
    /// When [`SequentialPlanner::f_forward_t`] returns an error.
    #[track_caller]
    pub fn forward_t<M>(&mut self, modules: &[M], input: &Tensor, train: bool) -> Tensor
    where
        M: ModuleT + ShallowClone + 'static,
    {
        self.f_forward_t(modules, input, train)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fallible twin of [`SequentialPlanner::forward_t`].
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_forward`].
    #[track_caller]
    pub fn f_forward_t<M>(
        &mut self,
        modules: &[M],
        input: &Tensor,
        train: bool,
    ) -> Result<Tensor, CkptError>
    where
        M: ModuleT + ShallowClone + 'static,
    {
        let step = move |m: &M, xs: &Tensor| m.forward_t(xs, train);
        // Nested in a segment with a policy, the chain's calls stay out of its cache: it
        // runs plainly without grad and the plan with grad.
        let _off = crate::ffi::OutsidePolicy::enter();
        if !crate::ffi::grad_enabled() {
            return plain_chain(modules, input, step);
        }
        let plan = self.f_plan_t(modules, input, train)?;
        check_len(modules.len(), plan)?;
        run_chain(modules, &plan.ranges(), plan.modes(), input, step)
    }
}
