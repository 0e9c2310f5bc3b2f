//! The body of `__ckpt_forward`: the stages in order, or, for a checkpointed model, the
//! chain cut as the schedule says for this call, every segment but the last through
//! `::ckpt::__private::segment` with one shared shallow clone of the model; segments the
//! planner keeps, and runs of `#[keep]` stages taken out of their segments, run inline
//! (`ModelPlans::segments`).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use super::{lets, located_at, needs_train, tensor, type_span};
use crate::model::ast::Model;
use crate::shared::mixed;

/// The body of `__ckpt_forward(&self, __ckpt_xs, __ckpt_train)`.
pub(super) fn forward_body(model: &Model, ctx_ty: &TokenStream) -> TokenStream {
    let t = tensor();
    let (xs, train, ctx, h, i) = (
        mixed("__ckpt_xs"),
        mixed("__ckpt_train"),
        mixed("__ckpt_ctx"),
        mixed("__ckpt_h"),
        mixed("__ckpt_i"),
    );
    let Some(checkpoint) = &model.checkpoint else {
        return quote! {
            let #ctx = self.__ckpt_context(#xs, #train);
            let mut #h = #t::shallow_clone(#xs);
            for #i in 0..self.__ckpt_len() {
                #h = self.__ckpt_stage(#i, #h, #train, &#ctx);
            }
            #h
        };
    };
    let (options, shared, k, range, name, count, guard, this, x, c) = (
        mixed("__ckpt_options"),
        mixed("__ckpt_shared"),
        mixed("__ckpt_k"),
        mixed("__ckpt_range"),
        mixed("__ckpt_name"),
        mixed("__ckpt_count"),
        mixed("__ckpt_guard"),
        mixed("__ckpt_this"),
        mixed("__ckpt_x"),
        mixed("__ckpt_c"),
    );
    let new_options = crate::args::options_tokens(
        checkpoint.preserve_rng_state,
        checkpoint.determinism_check,
        Some(quote!(self.__ckpt_plans.policy())),
    );
    let method = if needs_train(model) {
        "forward_t"
    } else {
        "forward"
    };
    let line = quote_spanned!(model.ident.span()=> ::core::line!());
    let key_train = if needs_train(model) {
        quote!(::core::option::Option::Some(#train))
    } else {
        quote!(::core::option::Option::None)
    };
    let (len, p_x, planned, r, e) = (
        mixed("__ckpt_len"),
        mixed("__ckpt_px"),
        mixed("__ckpt_planned"),
        mixed("__ckpt_r"),
        mixed("__ckpt_e"),
    );
    let ranges_expr = quote! {{
        let #len = self.__ckpt_len();
        let #planned = self.__ckpt_plans.segments(#len, #xs, #key_train, |#i| self.__ckpt_kept(#i), || {
            ::ckpt::__private::profile_stages(&#options, #len, #xs, |#i: usize, #p_x: &#t| {
                self.__ckpt_stage(#i, #t::shallow_clone(#p_x), #train, &#ctx)
            })
        });
        match #planned {
            ::core::result::Result::Ok(#r) => #r,
            ::core::result::Result::Err(#e) => ::core::panic!(
                "{}::{}: {}",
                ::ckpt::__private::short_type_name::<Self>(),
                #method,
                #e
            ),
        }
    }};
    let ctx_in = lets(model).enumerate().map(|(n, l)| {
        let n = syn::Index::from(n);
        located_at(quote!(::ckpt::__private::dup(&#ctx.#n)), type_span(&l.ty))
    });
    let (segs, captured, policy, opts) = (
        mixed("__ckpt_segments"),
        mixed("__ckpt_captured"),
        mixed("__ckpt_policy"),
        mixed("__ckpt_opts"),
    );
    let off = mixed("__ckpt_off");
    quote! {
        // Nested in a segment with a policy, the model's calls stay out of its cache: the
        // chain runs every stage inline without grad and the plan with grad.
        let #off = ::ckpt::__private::OutsidePolicy::enter();
        let #ctx = self.__ckpt_context(#xs, #train);
        let #options = #new_options;
        // The schedule's or the plan's segments, kept ones and `#[keep]` stages inline.
        let #segs: ::std::vec::Vec<(::core::ops::Range<usize>, ::core::option::Option<::ckpt::Policy>)> =
            #ranges_expr;
        let #count = #segs.len();
        let mut #captured = ::core::option::Option::None;
        let mut #h = #t::shallow_clone(#xs);
        for (#k, (#range, #policy)) in #segs.into_iter().enumerate() {
            let ::core::option::Option::Some(#policy) = #policy else {
                for #i in #range {
                    #h = self.__ckpt_stage(#i, #h, #train, &#ctx);
                }
                continue;
            };
            let (#opts, #shared) = &*#captured.get_or_insert_with(|| {
                ::ckpt::__private::capture(::core::clone::Clone::clone(&#options), self)
            });
            let #name = ::ckpt::__private::chain_segment_name(
                ::core::option::Option::Some(::ckpt::__private::short_type_name::<Self>()),
                #method,
                #k + 1,
                #count,
                (
                    ::core::clone::Clone::clone(&#range),
                    self.__ckpt_stage_name(#range.start),
                    self.__ckpt_stage_name(#range.end - 1),
                ),
                ::core::file!(),
                #line,
            );
            let #shared = ::ckpt::__private::ShallowClone::shallow_clone(#shared);
            #h = ::ckpt::__private::segment(
                &::core::clone::Clone::clone(#opts).policy(#policy),
                #name,
                move |(#x, #c): (#t, #ctx_ty)| -> #t {
                    let #guard = #shared.lock();
                    let #this = &*#guard;
                    let mut #x = #x;
                    for #i in ::core::clone::Clone::clone(&#range) {
                        #x = #this.__ckpt_stage(#i, #x, #train, &#c);
                    }
                    #x
                },
                (#h, (#(#ctx_in,)*)),
            );
        }
        #h
    }
}
