//! The public schedule API of a checkpointed model (`schedule`, `set_schedule`,
//! `set_segments`, `policy`, `set_policy`, `set_plan`, `set_auto`, `set_budget`,
//! `plan_for`, `stage_names`, `clear_plans`): one table of methods, from which both the
//! expansion and the stubs emitted next to errors are generated, so that the two always
//! declare the same methods.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Generics;

use super::{needs_train, tensor};
use crate::model::ast::Model;
use crate::shared::mixed;

/// One method of the schedule API.
struct Method {
    /// Its doc comment.
    docs: TokenStream,
    /// `fn name(&self, ..) -> T`, without the visibility.
    sig: TokenStream,
    /// Its body in the expansion (the stubs' is `unimplemented!()`).
    body: TokenStream,
}

/// The methods, in the order they are emitted.
fn methods(model: &Model) -> Vec<Method> {
    let t = tensor();
    let (schedule, plan, err, result) = (
        quote!(::ckpt::plan::Schedule),
        quote!(::ckpt::plan::Plan),
        quote!(::ckpt::CkptError),
        quote!(::core::result::Result),
    );
    let method = if needs_train(model) {
        "forward_t"
    } else {
        "forward"
    };
    let (train_param, train_arg, key_train) = if needs_train(model) {
        let train = mixed("train");
        (
            quote!(, #train: bool),
            quote!(#train),
            quote!(::core::option::Option::Some(#train)),
        )
    } else {
        (
            TokenStream::new(),
            quote!(false),
            quote!(::core::option::Option::None),
        )
    };
    let c = model.checkpoint.as_ref();
    let new_options = crate::args::options_tokens(
        c.and_then(|c| c.preserve_rng_state),
        c.and_then(|c| c.determinism_check),
        Some(quote!(self.__ckpt_plans.policy())),
    );
    let (xs, len, ctx, options, i, p_x) = (
        mixed("xs"),
        mixed("__ckpt_len"),
        mixed("__ckpt_ctx"),
        mixed("__ckpt_options"),
        mixed("__ckpt_i"),
        mixed("__ckpt_px"),
    );
    let kept = model.kept().next().is_some();
    let plan_doc = format!(
        " The plan the chain is cut with for inputs like `xs` (and the train flag): the cuts, \
         the predicted peak memory and extra time (`Plan::explain`, or `Display`). For \
         `segments = auto` and `budget` schedules it is the planner's plan, cached per input \
         shape, dtype, device and train flag, which the next `{method}` uses; for fixed \
         schedules, their cuts evaluated on the profile. Profiles the stages on first sight \
         of the input (two extra forwards and one backward of each stage; the random \
         generators' states are saved and restored around it, so seeded runs stay \
         reproducible, but running statistics such as batch norm's are updated by it).{}",
        if kept {
            " Stages marked `#[keep]` are kept in every plan: the planner's, and a fixed \
             schedule's (its segments split around them)."
        } else {
            ""
        }
    );
    let auto_doc = quote! {
        /// None in practice; `Result` for symmetry with the other setters.
    };
    vec![
        Method {
            docs: quote! {
                /// The schedule the chain is cut with: the one `#[checkpointed(..)]` declares,
                /// or the last `set_schedule`.
            },
            sig: quote!(fn schedule(&self) -> #schedule),
            body: quote!(::core::clone::Clone::clone(self.__ckpt_plans.schedule())),
        },
        Method {
            docs: quote! {
                /// Cuts the chain as `schedule` says from the next forward call on
                /// (`Schedule::Segments(n)`, `Schedule::Cuts(..)`, `Schedule::Auto(..)`).
                /// Plans cached for the old schedule are forgotten; profiles are kept.
                ///
                /// # Errors
                ///
                /// `CkptError::InvalidArgument` for `Segments(0)`, cuts that are not strictly
                /// increasing within `1..stages`, or a budget fraction that is not positive
                /// and finite; the schedule is unchanged then.
            },
            sig: quote!(fn set_schedule(&mut self, schedule: #schedule) -> #result<(), #err>),
            body: quote! {
                let #len = self.__ckpt_len();
                self.__ckpt_plans.set(schedule, #len)
            },
        },
        Method {
            docs: quote! {
                /// `set_schedule(Schedule::Segments(segments))`: `segments` groups as
                /// `ckpt::sequential_segments` makes them (1 checkpoints nothing).
                ///
                /// # Errors
                ///
                /// `CkptError::InvalidArgument` for `segments = 0`.
            },
            sig: quote!(fn set_segments(&mut self, segments: usize) -> #result<(), #err>),
            body: quote!(self.set_schedule(#schedule::Segments(segments))),
        },
        Method {
            docs: quote! {
                /// What each checkpointed segment keeps from its forward: the one
                /// `#[checkpointed(policy = ..)]` declares (default `Policy::RECOMPUTE_ALL`),
                /// or the last `set_policy`.
            },
            sig: quote!(fn policy(&self) -> ::ckpt::Policy),
            body: quote!(self.__ckpt_plans.policy()),
        },
        Method {
            docs: quote! {
                /// Sets what each checkpointed segment keeps from its forward, from the next
                /// forward call on (selective checkpointing: `ckpt::Policy::selective()` keeps
                /// linear outputs and dropout masks; gradients are unchanged).
            },
            sig: quote!(fn set_policy(&mut self, policy: ::ckpt::Policy)),
            body: quote!(self.__ckpt_plans.set_policy(policy);),
        },
        Method {
            docs: quote! {
                /// `set_schedule(Schedule::Cuts(plan.cuts()))`: the cuts of a plan (of
                /// `plan_for`, or of `ChainCost::evaluate` on this model's profile). Only
                /// the cuts are taken: the segments run with the model's policy, and a
                /// segment the plan keeps is checkpointed unless its stages are `#[keep]`.
                ///
                /// # Errors
                ///
                /// `CkptError::InvalidArgument` when the plan is for a chain of another length.
            },
            sig: quote!(fn set_plan(&mut self, plan: &#plan) -> #result<(), #err>),
            body: quote! {
                let #len = self.__ckpt_len();
                if plan.len() != #len {
                    return #result::Err(::ckpt::CkptError::InvalidArgument(::std::format!(
                        "the plan is for a chain of {} stages, but `{}` has {}",
                        plan.len(),
                        ::ckpt::__private::short_type_name::<Self>(),
                        #len
                    )));
                }
                self.set_schedule(#schedule::Cuts(::std::vec::Vec::from(plan.cuts())))
            },
        },
        Method {
            docs: quote! {
                /// `set_schedule(Schedule::Auto(Objective::MinPeak))`: `segments = auto`, the
                /// planner's cuts for the least predicted peak.
                ///
                /// # Errors
                ///
                #auto_doc
            },
            sig: quote!(fn set_auto(&mut self) -> #result<(), #err>),
            body: quote!(self.set_schedule(#schedule::Auto(::ckpt::plan::Objective::MinPeak))),
        },
        Method {
            docs: quote! {
                /// `set_schedule(Schedule::Auto(Objective::Budget(budget)))`: the planner's
                /// cuts for the least recompute within `budget` (`"512 MiB".parse()?`,
                /// `"40%".parse()?`, `Budget::Bytes(..)`). A budget below the least feasible
                /// peak makes the next training forward panic with `CkptError::BudgetTooSmall`,
                /// which states the smallest feasible budget; `plan_for` returns it as an error.
                ///
                /// # Errors
                ///
                /// `CkptError::InvalidArgument` for a fraction that is not positive and finite.
            },
            sig: quote!(fn set_budget(&mut self, budget: ::ckpt::plan::Budget) -> #result<(), #err>),
            body: quote!(self.set_schedule(#schedule::Auto(::ckpt::plan::Objective::Budget(budget)))),
        },
        Method {
            docs: quote! {
                #[doc = #plan_doc]
                ///
                /// # Errors
                ///
                /// `CkptError::BudgetTooSmall` when no plan fits the budget; as
                /// `ckpt::memory::f_stats` for an unsupported device.
            },
            sig: quote!(fn plan_for(&self, #xs: &#t #train_param) -> #result<#plan, #err>),
            body: quote! {
                let #len = self.__ckpt_len();
                let #ctx = self.__ckpt_context(#xs, #train_arg);
                let #options = #new_options;
                self.__ckpt_plans.plan(#len, #xs, #key_train, |#i| self.__ckpt_kept(#i), || {
                    ::ckpt::__private::profile_stages(&#options, #len, #xs, |#i: usize, #p_x: &#t| {
                        self.__ckpt_stage(#i, #t::shallow_clone(#p_x), #train_arg, &#ctx)
                    })
                })
                .map(|plan| plan.with_stage_names(self.stage_names()))
            },
        },
        Method {
            docs: quote! {
                /// The names of the stages of the chain, in order (`fc1`, `relu`,
                /// `blocks[3]`); their number is the length of the chain.
            },
            sig: quote!(fn stage_names(&self) -> ::std::vec::Vec<::std::string::String>),
            body: quote!((0..self.__ckpt_len()).map(|#i| self.__ckpt_stage_name(#i)).collect()),
        },
        Method {
            docs: quote! {
                /// Forgets the profiles and plans cached for every input: the next training
                /// call (or `plan_for`) profiles again.
            },
            sig: quote!(fn clear_plans(&self)),
            body: quote!(self.__ckpt_plans.clear();),
        },
    ]
}

/// The schedule API of a checkpointed model (nothing for a plain one), on the runtime
/// bounds `rt`.
pub(super) fn schedule_methods(model: &Model, rt: &Generics) -> TokenStream {
    if model.checkpoint.is_none() {
        return TokenStream::new();
    }
    let (ident, vis) = (&model.ident, &model.vis);
    let (rt_impl, ty_g, rt_where) = rt.split_for_impl();
    let methods = methods(model)
        .into_iter()
        .map(|Method { docs, sig, body }| {
            quote! {
                #docs
                #vis #sig {
                    #body
                }
            }
        });
    quote! {
        #[allow(dead_code)]
        impl #rt_impl #ident #ty_g #rt_where {
            #(#methods)*
        }
    }
}

/// The same methods as stubs (`unimplemented!()`), for a declaration marked checkpointed
/// whose expansion failed: code calling them reports no follow-on errors.
pub(super) fn schedule_stubs(model: &Model) -> TokenStream {
    if !model.checkpointed {
        return TokenStream::new();
    }
    let (ident, vis) = (&model.ident, &model.vis);
    let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
    let sigs = methods(model).into_iter().map(|m| m.sig);
    quote! {
        #[allow(dead_code, unused_variables, clippy::all)]
        impl #impl_g #ident #ty_g #where_g {
            #(#vis #sigs { ::core::unimplemented!() })*
        }
    }
}
