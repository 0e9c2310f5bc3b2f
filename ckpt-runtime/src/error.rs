//! The error type of `ckpt`.

/// Everything that can go wrong in `ckpt`'s runtime.
///
/// Each panicking function of the crate has an `f_` twin returning
/// `Result<_, CkptError>` (tch's convention); the panicking one panics with this error's
/// message. Errors that arise during recompute, inside `loss.backward()`, reach you
/// through tch: `loss.f_backward()` returns `Err(TchError::Torch(message))` whose message
/// is this error's text (it names the segment), and `loss.backward()` panics with it.
/// Besides a closure's panic, the node's backward itself refuses a recompute whose outputs
/// differ from the forward's (count, shapes, dtypes, devices), an input of the segment
/// changed in place since forward, a second backward through a freed graph, and a
/// recompute the closure ran without grad so that no output receiving a gradient has a
/// graph (see `checkpoint`): each message names the segment, says what happened and the
/// fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CkptError {
    /// An argument is outside its valid range (for example `segments = 0`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The checkpointed closure panicked; `message` is the panic message. Raised from
    /// `f_checkpoint` when it happens in forward; during recompute the same text reaches
    /// you through `loss.f_backward()`.
    #[error("checkpoint `{segment}`: the closure panicked{during}: {message}", during = if *.recompute { " during recompute" } else { "" })]
    ClosurePanicked {
        /// The segment's name (`CheckpointOptions::name`, or the caller's source location).
        segment: String,
        /// Whether the panic happened while recomputing in backward.
        recompute: bool,
        /// The panic payload, when it is a string.
        message: String,
    },

    /// libtorch raised an error (the message is libtorch's, prefixed by the segment when
    /// there is one).
    #[error("libtorch: {0}")]
    Torch(String),

    /// CUDA was asked for but is not available, or its allocator statistics failed.
    #[error("CUDA: {0}")]
    Cuda(String),

    /// A variable a launcher sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...) is missing
    /// or out of range, or an argument of [`crate::dist::init`] is (`ckpt::dist`).
    #[error("distributed set-up: {0}")]
    DistEnv(String),

    /// PyTorch's distributed engine (c10d: the TCPStore, a process group, a collective, the
    /// DDP Reducer) reported an error: an unreachable master or a peer that did not answer
    /// within the timeout, a port in use, parameters that differ between ranks. The
    /// message is c10d's.
    #[error("c10d: {0}")]
    Dist(String),

    /// No plan of the chain fits the memory budget (`ckpt::plan`): even the plan with the
    /// least predicted peak needs `min_bytes`.
    #[error("{}", budget_too_small(*.budget_bytes, *.min_bytes, *.plain_bytes, *.marked_keep))]
    BudgetTooSmall {
        /// The budget asked for, in bytes.
        budget_bytes: u64,
        /// The least predicted peak over all plans, in bytes: the smallest budget that
        /// can be met.
        min_bytes: u64,
        /// The predicted peak of the plain run (nothing checkpointed), in bytes; 0 when
        /// unknown.
        plain_bytes: u64,
        /// Whether stages marked keep (`model!`'s `#[keep]`, `#[ckpt::keep]`), which
        /// every plan must keep, raise that least peak.
        marked_keep: bool,
    },
}

/// The message of [`CkptError::BudgetTooSmall`]: the bytes, and their share of the plain
/// run's peak when known (a budget is often given as one).
fn budget_too_small(budget: u64, min: u64, plain: u64, marked_keep: bool) -> String {
    let share = |b: u64| {
        if plain == 0 {
            String::new()
        } else {
            format!(
                ", {:.1} % of the plain run's peak",
                100.0 * b as f64 / plain as f64
            )
        }
    };
    let keep = if marked_keep {
        " with the stages marked keep kept (every plan keeps them; unmark some to go lower)"
    } else {
        ""
    };
    format!(
        "memory budget of {} ({budget} B{}) is too small: the smallest feasible peak of this chain{keep} is {} ({min} B{})",
        crate::plan::human_bytes(budget),
        share(budget),
        crate::plan::human_bytes(min),
        share(min),
    )
}

impl From<tch::TchError> for CkptError {
    fn from(e: tch::TchError) -> Self {
        CkptError::Torch(e.to_string())
    }
}
